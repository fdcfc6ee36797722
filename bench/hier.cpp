// Hierarchical collectives (hp/comm/hier) against the flat ones on Gloo
// (HP_HIER_COLLECTIVES=0) for a world that spans hosts, in the same run: the two
// alternate, every rank starts each together (a Gloo barrier), the slowest rank counts.
// Run across hosts, e.g. two emulated hosts of 2 ranks with a 1 Gbit/s link:
//   bench/hier.sh [max MiB]
// Sizes: the all-reduced tensor, the gathered output, the reduce-scattered input. The
// ratio is flat's median time over hierarchical's.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "hp/comm.h"
#include "hp/comm/hier/hier.h"
#include "slowest_rank.h"

using namespace hp;
using namespace hp::comm;

namespace {

std::vector<double> median_seconds(const Group& g, int iters, const std::vector<std::function<void()>>& ops) {
  for (const auto& op : ops) op();  // warm-up: connections, segments, buffers
  const size_t k = ops.size();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    for (const auto& op : ops) {
      barrier(g);
      auto s = std::chrono::steady_clock::now();
      op();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
    }
  }
  ::setenv("HP_HIER_COLLECTIVES", "0", 1);  // a tiny message: keep it off the measured path's counters
  std::vector<double> out = slowest_rank_medians(g, t, iters, k);
  ::unsetenv("HP_HIER_COLLECTIVES");
  return out;
}

std::function<void()> flat(std::function<void()> f) {
  return [f] {
    ::setenv("HP_HIER_COLLECTIVES", "0", 1);
    f();
    ::unsetenv("HP_HIER_COLLECTIVES");
  };
}

}  // namespace

int main(int argc, char** argv) {
  auto world = init_distributed();
  auto g = world->world_group();
  const int n = g->size(), rank = g->rank();
  int64_t max_bytes = int64_t(64) << 20;
  if (argc > 1) max_bytes = int64_t(std::atoll(argv[1])) << 20;
  if (rank == 0) {
    std::printf("# %d ranks, %d per host, float32; median ms of flat Gloo and hierarchical (%zu KiB pieces)\n", n,
                world->ranks_per_host(), hier::piece_bytes() >> 10);
    std::printf("%-15s %8s %10s %10s %8s\n", "collective", "size", "flat_ms", "hier_ms", "ratio");
  }
  auto report = [&](const char* name, int64_t bytes, const std::vector<double>& t) {
    if (rank != 0) return;
    std::printf("%-15s %5lld MiB %10.2f %10.2f %7.2fx\n", name, (long long)(bytes >> 20), t[0] * 1e3, t[1] * 1e3,
                t[0] / t[1]);
    std::fflush(stdout);
  };
  const int64_t calls_before = hier::calls_on_this_thread();
  for (int64_t bytes = int64_t(1) << 20; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4;
    const int iters = bytes >= (16 << 20) ? 5 : 9;
    at::Tensor x = at::rand({numel});
    auto ar = [&] { all_reduce_(x, *g, ReduceOp::Avg); };  // Avg keeps the values bounded
    report("all_reduce", bytes, median_seconds(*g, iters, {flat(ar), ar}));
    at::Tensor part = x.narrow(0, 0, numel / n).clone();
    auto ag = [&] { all_gather(part, *g); };
    report("all_gather", bytes, median_seconds(*g, iters, {flat(ag), ag}));
    auto rs = [&] { reduce_scatter(x, *g); };
    report("reduce_scatter", bytes, median_seconds(*g, iters, {flat(rs), rs}));
  }
  if (rank == 0 && hier::calls_on_this_thread() == calls_before)
    std::printf("# WARNING: no collective ran hierarchically (one host? HP_HIER_COLLECTIVES=0?)\n");
  return 0;
}
