// How close hp's shared-memory collectives on private tensors come to one copy of the
// message, the least that all-gather, all-to-all and broadcast can do: every receiver
// writes its whole output. Each call, the copy included, is timed right after the same
// Gloo all-to-all of the message (itself timed: column `gloo_a2a`), so all find the
// caches as a collective in a training step would, after other work. A copy timed after
// itself finds a message of 16 MiB partly still in cache and runs 1.5-2x faster.
//   hprun --nproc-per-node 2 build/bin/bench_copy_bound [max MiB]
// Columns: median us of the slowest rank; `bound`: Gloo's all-to-all over the copy, the
// most any all-to-all moving each byte once could reach against it; `heap_copy`: the same
// copy into the heap's local region, where hp's all-gather and all-to-all put their
// outputs (4 KiB shared pages); `x copy`: each time over the copy's (broadcast: over
// (n-1)/n copies, as its ranks share them).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/stream_copy.h"
#include "hp/comm/symm/symm.h"
#include "slowest_rank.h"

using namespace hp;
using namespace hp::comm;

int main(int argc, char** argv) {
  auto world = init_distributed();
  auto g = world->world_group();
  const int n = g->size(), rank = g->rank();
  HP_CHECK(symm::shm_collectives_enabled(*g)) << "bench_copy_bound needs every rank on one host";
  const int64_t max_bytes = int64_t(argc > 1 ? std::atoll(argv[1]) : 64) << 20;
  if (rank == 0)
    std::printf("# %d ranks, float32, private tensors; median us, each call after a Gloo all-to-all\n"
                "%-8s %9s %9s %7s %10s %7s %11s %7s %11s %7s %10s %7s\n",
                n, "size", "gloo_a2a", "copy", "bound", "heap_copy", "x copy", "all_to_all", "x copy", "all_gather",
                "x copy", "broadcast", "x copy");
  for (int64_t bytes = int64_t(1) << 20; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4 / n * n;  // whole rows of the all-to-all
    at::Tensor x = at::rand({numel}), out = at::empty({numel}), to = at::empty({numel});
    at::Tensor rows = x.view({n, numel / n}), part = x.narrow(0, 0, numel / n);
    std::vector<int64_t> none;
    c10d::AllToAllOptions o;
    // Each copy ends at a barrier, as a collective does: with more ranks than cores, no
    // rank copies alone.
    const std::vector<std::function<void()>> ops = {
        [&] {
          symm::copy_large(to.data_ptr(), x.data_ptr(), x.nbytes());
          symm::barrier(*g);
        },
        [&] {  // allocated per call, as the collectives' outputs are, to leave them the room
          at::Tensor in_heap = symm::try_output_buffer(numel, at::kFloat, *g);
          HP_CHECK(in_heap.defined()) << "bench_copy_bound: no room for " << (bytes >> 20)
                                      << " MiB in the heap's local region (HP_SHM_LOCAL_MIB)";
          symm::copy_large(in_heap.data_ptr(), x.data_ptr(), x.nbytes());
          symm::barrier(*g);
        },
        [&] { all_to_all(rows, *g, 0, 0); },
        [&] { all_gather(part, *g); },
        [&] { broadcast_(x, *g, 0); },
    };
    const int iters = bytes >= (16 << 20) ? 15 : 31;
    const size_t k = ops.size();
    std::vector<double> t(2 * k * iters);  // per round and op: Gloo before it, then the op
    for (int i = 0; i < iters + 2; ++i) {  // two rounds of warm-up
      for (size_t j = 0; j < k; ++j) {
        // Each round starts at another op, so that no op always follows the same one.
        const size_t which = (i + j) % k;
        symm::barrier(*g);
        auto s = std::chrono::steady_clock::now();
        g->backend().alltoall_base(out, x, none, none, o)->wait();
        const double gloo = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
        // Twice: a rank that waited long in the first may have gone to sleep and leave it late.
        symm::barrier(*g);
        symm::barrier(*g);
        s = std::chrono::steady_clock::now();
        ops[which]();
        const double shm = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
        if (i >= 2) t[2 * (k * (i - 2) + which)] = gloo, t[2 * (k * (i - 2) + which) + 1] = shm;
      }
    }
    const std::vector<double> m = slowest_rank_medians(*g, t, iters, 2 * k);
    if (rank != 0) continue;
    const double gloo = m[0], copy = m[1];  // Gloo before the copy, and the copy
    const std::string size = std::to_string(bytes >> 20) + " MiB";
    std::printf("%-8s %9.1f %9.1f %6.1fx %10.1f %6.2fx %11.1f %6.2fx %11.1f %6.2fx %10.1f %6.2fx\n", size.c_str(),
                gloo * 1e6, copy * 1e6, gloo / copy, m[3] * 1e6, m[3] / copy, m[5] * 1e6, m[5] / copy, m[7] * 1e6,
                m[7] / copy, m[9] * 1e6, m[9] / (copy * (n - 1) / n));
    std::fflush(stdout);
  }
  return 0;
}
