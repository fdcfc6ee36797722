// Bus bandwidth of hp's collectives against the raw c10d Gloo call on the same sizes,
// in the same run. Run under hprun: `hprun --nproc-per-node 4 build/bin/bench_collectives`.
// Bus bandwidth follows nccl-tests: algbw * 2(n-1)/n for all-reduce, * (n-1)/n otherwise.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hp/comm.h"

using namespace hp;
using namespace hp::comm;

namespace {

// Median seconds of `base` and of `ours` over `iters` rounds. The two alternate, so both
// see the same machine; every rank starts each run together and reports the slowest rank.
std::pair<double, double> median_seconds(const Group& g, int iters, const std::function<void()>& base,
                                         const std::function<void()>& ours) {
  for (int i = 0; i < 3; ++i) {  // warm-up: connections, and the heap settling to its steady state
    base();
    ours();
  }
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    for (const auto* op : {&base, &ours}) {
      barrier(g);
      auto s = std::chrono::steady_clock::now();
      (*op)();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
    }
  }
  at::Tensor v = at::tensor(t, at::kDouble);
  all_reduce_(v, g, ReduceOp::Max);
  auto median = [&](int which) {
    std::vector<double> m;
    for (int i = 0; i < iters; ++i) m.push_back(v[2 * i + which].item<double>());
    std::nth_element(m.begin(), m.begin() + iters / 2, m.end());
    return m[iters / 2];
  };
  return {median(0), median(1)};
}

void wait(const WorkPtr& w) { w->wait(); }

}  // namespace

int main(int argc, char** argv) {
  auto world = init_distributed();
  auto g = world->world_group();
  const int n = g->size();
  const int rank = g->rank();
  Backend& raw = g->backend();
  const double ring = double(n - 1) / n;
  if (rank == 0) {
    std::printf("# %d ranks, float32, median bus bandwidth in GB/s (higher is better)\n", n);
    std::printf("%-16s %10s %12s %12s %8s\n", "collective", "size", "baseline", "hp", "ratio");
  }
  auto report = [&](const char* name, int64_t bytes, std::pair<double, double> t, double factor) {
    const double base_s = t.first, hp_s = t.second;
    if (rank != 0) return;
    double base_bw = bytes * factor / base_s / 1e9, hp_bw = bytes * factor / hp_s / 1e9;
    char size[32];
    if (bytes >= (1 << 20)) std::snprintf(size, sizeof size, "%lld MiB", (long long)(bytes >> 20));
    else std::snprintf(size, sizeof size, "%lld KiB", (long long)(bytes >> 10));
    std::printf("%-16s %10s %12.3f %12.3f %7.2fx\n", name, size, base_bw, hp_bw, hp_bw / base_bw);
    std::fflush(stdout);
  };

  int64_t max_bytes = int64_t(64) << 20;
  if (argc > 1) max_bytes = int64_t(std::atoll(argv[1])) << 20;
  for (int64_t bytes = 1 << 10; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4;
    const int iters = bytes >= (16 << 20) ? 9 : bytes >= (1 << 20) ? 15 : 30;
    at::Tensor x = at::rand({numel});

    // all_reduce: hp vs c10d allreduce.
    {
      std::vector<at::Tensor> v{x};
      c10d::AllreduceOptions o;
      report("all_reduce", bytes,
             median_seconds(*g, iters, [&] { wait(raw.allreduce(v, o)); }, [&] { all_reduce_(x, *g); }),
             2 * ring);
    }
    // all_to_all: hp (dimensional, equal splits) vs c10d alltoall_base.
    {
      at::Tensor out = at::empty_like(x);
      std::vector<int64_t> none;
      c10d::AllToAllOptions o;
      at::Tensor x2 = x.view({n, numel / n});
      report("all_to_all", bytes,
             median_seconds(*g, iters, [&] { wait(raw.alltoall_base(out, x, none, none, o)); },
                            [&] { all_to_all(x2, *g, 0, 0); }),
             ring);
    }
    // all_gather to a `bytes` output: hp vs c10d's list all-gather.
    {
      at::Tensor part = x.narrow(0, 0, numel / n).clone();
      std::vector<std::vector<at::Tensor>> outs{std::vector<at::Tensor>(n)};
      for (auto& o : outs[0]) o = at::empty_like(part);
      std::vector<at::Tensor> in{part};
      report("all_gather", bytes,
             median_seconds(*g, iters, [&] { wait(raw.allgather(outs, in)); }, [&] { all_gather(part, *g); }),
             ring);
    }
    // reduce_scatter of a `bytes` input: hp vs all-reduce + slice (Gloo has none).
    {
      std::vector<at::Tensor> v{x};
      c10d::AllreduceOptions o;
      const int64_t chunk = numel / n;
      report("reduce_scatter", bytes,
             median_seconds(
                 *g, iters,
                 [&] {
                   wait(raw.allreduce(v, o));
                   x.narrow(0, rank * chunk, chunk).clone();
                 },
                 [&] { reduce_scatter(x, *g); }),
             ring);
    }
  }
  return 0;
}
