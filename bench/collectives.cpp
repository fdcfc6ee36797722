// hp's collectives over shared memory (hp/comm/symm, chosen for groups on one host)
// against the same calls over Gloo (HP_SHM_COLLECTIVES=0), and against raw c10d Gloo
// where c10d has the collective, in the same run. Run under hprun:
//   hprun --nproc-per-node 4 build/bin/bench_collectives [max MiB] [collectives]
// `collectives`: a comma-separated subset to run (default all), e.g. reduce_scatter, whose
// block also times what a reduce-scatter replaces, an all-reduce and a slice, on both
// transports (RESULT all_reduce_slice_over_reduce_scatter_*: the all-reduce + slice time
// over the reduce-scatter's).
// Bus bandwidth follows nccl-tests: algbw * 2(n-1)/n for all-reduce, * (n-1)/n otherwise
// (broadcast: * 1). The ratio is Gloo's median time over shared memory's. One copy of
// the message on every rank at once (memcpy, and hp's streamed copy_large), per size, is
// the bus bandwidth's ceiling for private tensors. Rows *_symm run the same call on
// tensors in the symmetric heap; all_reduce_staged and all_reduce_windows, on private
// tensors always staged in the heap (HP_SHM_STAGING=1) or always through the windows (0),
// where the plain row takes the way timed faster.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "hp/base/strings.h"
#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/stream_copy.h"
#include "hp/comm/symm/symm.h"
#include "slowest_rank.h"

using namespace hp;
using namespace hp::comm;

namespace {

// Runs `f` with hp's collectives on Gloo.
std::function<void()> on_gloo(std::function<void()> f) {
  return [f] {
    ::setenv("HP_SHM_COLLECTIVES", "0", 1);
    f();
    ::setenv("HP_SHM_COLLECTIVES", "1", 1);
  };
}

// Runs `f` with large private tensors always staged in the heap ("1") or always sent
// through the windows ("0"), instead of the way timed faster.
std::function<void()> staging(const char* always, std::function<void()> f) {
  return [always, f] {
    ::setenv("HP_SHM_STAGING", always, 1);
    f();
    ::unsetenv("HP_SHM_STAGING");
  };
}

void wait(const WorkPtr& w) { w->wait(); }

std::string size_name(int64_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  ::setenv("HP_SYMM_HEAP_MIB", "160", 0);  // room for a 64 MiB symmetric tensor
  auto world = init_distributed();
  auto g = world->world_group();
  const int n = g->size();
  const int rank = g->rank();
  Backend& raw = g->backend();
  const double ring = double(n - 1) / n;
  if (rank == 0) {
    std::printf("# %d ranks, float32, shared memory %s; median time (us) and bus bandwidth (GB/s)\n", n,
                symm::shm_collectives_enabled(*g) ? "on" : "UNAVAILABLE (group spans hosts?)");
    std::printf("# c10d: the raw Gloo call where there is one; gloo: hp over Gloo; shm: hp over shared memory\n");
    std::printf("%-19s %8s %10s %10s %10s %9s %9s %9s %8s\n", "collective", "size", "c10d_us", "gloo_us", "shm_us",
                "c10d_bw", "gloo_bw", "shm_bw", "ratio");
  }
  // t: {c10d (when it has the call), hp over Gloo, hp over shared memory, then one more
  // shared-memory variant per entry of `extra`, named by its suffix}. Every row's ratio is
  // against the faster Gloo of the two on private tensors, the baseline a user starts from.
  auto report = [&](const char* name, int64_t bytes, std::vector<double> t, double factor, bool has_c10d,
                    const std::vector<std::string>& extra) {
    if (rank != 0) return;
    if (!has_c10d) t.insert(t.begin(), 0.0);
    auto bw = [&](double s) { return s > 0 ? bytes * factor / s / 1e9 : 0.0; };
    const double gloo = has_c10d ? std::min(t[0], t[1]) : t[1];
    auto row = [&](const std::string& label, double c10d, double hp_gloo, double shm) {
      std::printf("%-19s %8s %10.1f %10.1f %10.1f %9.3f %9.3f %9.3f %7.1fx\n", label.c_str(), size_name(bytes).c_str(),
                  c10d * 1e6, hp_gloo * 1e6, shm * 1e6, bw(c10d), bw(hp_gloo), bw(shm), gloo / shm);
    };
    row(name, t[0], t[1], t[2]);
    for (size_t i = 0; i < extra.size(); ++i) row(name + extra[i], t[0], t[1], t[3 + i]);
    std::fflush(stdout);
  };

  int64_t max_bytes = int64_t(64) << 20;
  if (argc > 1) max_bytes = int64_t(std::atoll(argv[1])) << 20;
  std::vector<std::string> only;  // empty: every collective
  if (argc > 2)
    for (const std::string& c : split(argv[2], ','))
      if (!c.empty()) only.push_back(c);
  auto wanted = [&](const char* name) { return only.empty() || std::find(only.begin(), only.end(), name) != only.end(); };
  std::vector<std::string> results;
  ::setenv("HP_SHM_COLLECTIVES", "1", 1);
  for (int64_t bytes = 1 << 10; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4;
    const int iters = bytes >= (16 << 20) ? 9 : bytes >= (1 << 20) ? 15 : 25;
    const int calls = bytes >= (1 << 20) ? 1 : 8;
    at::Tensor x = at::rand({numel});

    {  // the ceiling: one copy of the message on every rank at once, the faster of memcpy and
       // hp's streamed copy (bus bandwidth can reach it only by moving each byte once; Gloo's
       // loopback TCP copies it at least twice)
      // Each ends at a barrier, as a collective does: with more ranks than cores, a rank
      // that runs its copy before its peers are scheduled would otherwise time it alone.
      at::Tensor from = at::rand({numel}), to = at::empty({numel});
      auto copy = [&] {
        std::memcpy(to.data_ptr(), from.data_ptr(), bytes);
        symm::barrier(*g);
      };
      auto streamed = [&] {
        symm::copy_large(to.data_ptr(), from.data_ptr(), bytes);
        symm::barrier(*g);
      };
      const auto s = median_seconds(*g, iters, calls, {copy, streamed});
      if (rank == 0) {
        for (int i = 0; i < 2; ++i)
          std::printf("%-19s %8s %10s %10s %10.1f %9s %9s %9.3f\n", i ? "copy_large" : "memcpy",
                      size_name(bytes).c_str(), "", "", s[i] * 1e6, "", "", bytes / s[i] / 1e9);
        std::fflush(stdout);
      }
    }
    // A copy of `t` in the symmetric heap (hp::symm::empty): its collectives read peers'
    // buffers in place.
    auto in_heap = [&](const at::Tensor& t) { return symm::empty(t.sizes(), t.scalar_type(), *g).copy_(t); };
    if (wanted("all_reduce")) {  // Avg keeps the values bounded over the repetitions
      std::vector<at::Tensor> v{x};
      c10d::AllreduceOptions o;
      at::Tensor s = in_heap(x);
      auto hp_call = [&] { all_reduce_(x, *g, ReduceOp::Avg); };
      report("all_reduce", bytes,
             median_seconds(*g, iters, calls,
                            {[&] { wait(raw.allreduce(v, o)); }, on_gloo(hp_call), hp_call,
                             [&] { all_reduce_(s, *g, ReduceOp::Avg); }, staging("1", hp_call),
                             staging("0", hp_call)}),
             2 * ring, true, {"_symm", "_staged", "_windows"});
    }
    if (wanted("reduce_scatter")) {  // of a `bytes` input (c10d's Gloo has none)
      at::Tensor s = in_heap(x);
      auto hp_call = [&] { reduce_scatter(x, *g); };
      const int64_t piece = numel / n;  // what the reduce-scatter leaves this rank
      auto all_reduce_slice = [&] { all_reduce(x, *g).narrow(0, rank * piece, piece).contiguous(); };
      std::vector<double> t = median_seconds(
          *g, iters, calls,
          {on_gloo(hp_call), hp_call, [&] { reduce_scatter(s, *g); }, on_gloo(all_reduce_slice), all_reduce_slice});
      report("reduce_scatter", bytes, {t[0], t[1], t[2]}, ring, false, {"_symm"});
      if (rank == 0) {
        std::printf("%-19s %8s %10s %10.1f %10.1f %29s %7.2fx (gloo %.2fx)\n", "all_reduce+slice",
                    size_name(bytes).c_str(), "", t[3] * 1e6, t[4] * 1e6, "reduce_scatter speedup:", t[4] / t[1],
                    t[3] / t[0]);
        std::string size = size_name(bytes);
        size.erase(std::remove(size.begin(), size.end(), ' '), size.end());
        for (auto [via, ratio] : {std::pair<const char*, double>{"shm", t[4] / t[1]}, {"gloo", t[3] / t[0]}}) {
          char line[160];
          std::snprintf(line, sizeof line, "RESULT all_reduce_slice_over_reduce_scatter_%s_%dr_%s %.3f", via, n,
                        size.c_str(), ratio);
          results.push_back(line);
        }
        std::fflush(stdout);
      }
    }
    if (wanted("all_gather")) {  // to a `bytes` output, against c10d's list all-gather
      at::Tensor part = x.narrow(0, 0, numel / n).clone(), s = in_heap(part);
      std::vector<std::vector<at::Tensor>> outs{std::vector<at::Tensor>(n)};
      for (auto& o : outs[0]) o = at::empty_like(part);
      std::vector<at::Tensor> in{part};
      auto hp_call = [&] { all_gather(part, *g); };
      report("all_gather", bytes,
             median_seconds(*g, iters, calls,
                            {[&] { wait(raw.allgather(outs, in)); }, on_gloo(hp_call), hp_call,
                             [&] { all_gather(s, *g); }}),
             ring, true, {"_symm"});
    }
    if (wanted("all_to_all")) {  // equal splits
      at::Tensor out = at::empty_like(x);
      std::vector<int64_t> none;
      c10d::AllToAllOptions o;
      at::Tensor x2 = x.view({n, numel / n}), s = in_heap(x2);
      auto hp_call = [&] { all_to_all(x2, *g, 0, 0); };
      report("all_to_all", bytes,
             median_seconds(*g, iters, calls,
                            {[&] { wait(raw.alltoall_base(out, x, none, none, o)); }, on_gloo(hp_call), hp_call,
                             [&] { all_to_all(s, *g, 0, 0); }}),
             ring, true, {"_symm"});
    }
    if (wanted("all_to_all_v")) {  // uneven splits: rank r sends piece s of (r + s + 1) units, `bytes` on average
      std::vector<int64_t> send(n), recv(n);
      const int64_t unit = std::max<int64_t>(1, numel / (n * n));
      int64_t units = 0;
      for (int s = 0; s < n; ++s) units += rank + s + 1;
      for (int s = 0; s < n; ++s) send[s] = (rank + s + 1) * unit, recv[s] = (s + rank + 1) * unit;
      at::Tensor in = at::rand({units * unit});
      int64_t got = 0;
      for (auto r : recv) got += r;
      at::Tensor out = at::empty({got});
      auto hp_call = [&] { all_to_all_single_async(out, in, *g, recv, send).wait(); };
      report("all_to_all_v", bytes, median_seconds(*g, iters, calls, {on_gloo(hp_call), hp_call}), ring, false, {});
    }
    if (wanted("broadcast")) {  // from rank 0
      std::vector<at::Tensor> v{x};
      c10d::BroadcastOptions o;
      at::Tensor s = in_heap(x);
      auto hp_call = [&] { broadcast_(x, *g, 0); };
      report("broadcast", bytes,
             median_seconds(*g, iters, calls,
                            {[&] { wait(raw.broadcast(v, o)); }, on_gloo(hp_call), hp_call,
                             [&] { broadcast_(s, *g, 0); }}),
             1.0, true, {"_symm"});
    }
  }
  for (const std::string& line : results) std::printf("%s\n", line.c_str());
  return 0;
}
