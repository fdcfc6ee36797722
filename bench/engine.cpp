// The cost of moving the shared-memory collectives onto the progress engine, in one run:
//   build/bin/hprun --nproc-per-node N build/bin/bench_engine [max KiB]
// sync: all_reduce_ as users call it (transport choice, drain of the engine, the call);
// bare: the same shared-memory all-reduce called directly on the group's heap, with no
// dispatch at all (a lower bound for any version of the dispatch, today's or an older
// one); async: all_reduce_async + wait (a hand-off to the progress thread and back).
// Candidates alternate batch by batch; each is the slowest rank's median. Ratios are
// bare's time over sync's (and over async's): 1.0 means no cost.
//
// Then overlap: an all-reduce issued before a stretch of emulated compute (a sleep as long
// as the all-reduce takes alone: work that waits without using a core, as on an
// accelerator) and waited after it, with the collective on the progress engine and on the
// caller (HP_ASYNC_COLLECTIVES=0), alternating. Exposed communication is the step's time
// minus the compute's; its ratio (engine over caller) is 0 for perfect overlap, 1 for none.
// Groups that span hosts (scripts/emulate_hosts) run only this part, hierarchically.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/symm.h"
#include "slowest_rank.h"

using namespace hp;
using namespace hp::comm;

int main(int argc, char** argv) {
  auto world = init_distributed();
  auto g = world->world_group();
  const bool shm = symm::shm_collectives_enabled(*g);
  const int64_t max_kib = !shm ? 0 : argc > 1 ? std::atoll(argv[1]) : 4096;
  if (g->rank() == 0 && shm)
    std::printf("# %d ranks, float32 all-reduce (sum); median us per call, slowest rank\n%-8s %10s %10s %10s %10s %10s\n",
                g->size(), "size", "bare_us", "sync_us", "async_us", "bare/sync", "bare/async");
  for (int64_t kib = 1; kib <= max_kib; kib *= 4) {
    const int64_t numel = kib * 256;
    at::Tensor x = at::rand({numel});
    const int iters = kib >= 1024 ? 15 : 31, calls = kib >= 1024 ? 2 : 16;
    auto s = median_seconds(*g, iters, calls,
                            {[&] { symm::all_reduce(*symm::group_heap(*g), x, ReduceOp::Sum); },
                             [&] { all_reduce_(x, *g, ReduceOp::Sum); },
                             [&] { all_reduce_async(x, *g, ReduceOp::Sum).wait(); }});
    if (g->rank() != 0) continue;
    std::printf("%5lld KiB %10.1f %10.1f %10.1f %9.3fx %9.3fx\n", (long long)kib, s[0] * 1e6, s[1] * 1e6, s[2] * 1e6,
                s[0] / s[1], s[0] / s[2]);
    std::printf("RESULT engine_sync_over_bare_%lldKiB %.3f\n", (long long)kib, s[0] / s[1]);
    std::printf("RESULT engine_async_over_bare_%lldKiB %.3f\n", (long long)kib, s[0] / s[2]);
    std::fflush(stdout);
  }

  if (g->rank() == 0)
    std::printf("# overlap: all-reduce, then emulated compute as long as it, then wait\n%-8s %10s %12s %12s %10s\n",
                "size", "comm_ms", "engine_ms", "caller_ms", "exposed");
  for (int64_t mib : {1, 4, 16}) {
    at::Tensor x = at::rand({mib << 18});
    auto once = [&] { all_reduce_(x, *g, ReduceOp::Max); };
    const double comm = median_seconds(*g, 7, 1, {once})[0];
    const auto compute = std::chrono::duration<double>(comm);
    auto step = [&](bool engine) {
      return [&, engine] {
        if (!engine) ::setenv("HP_ASYNC_COLLECTIVES", "0", 1);
        Pending p = all_reduce_async(x, *g, ReduceOp::Max);
        std::this_thread::sleep_for(compute);
        p.wait();
        ::unsetenv("HP_ASYNC_COLLECTIVES");
      };
    };
    auto s = median_seconds(*g, 9, 1, {step(true), step(false)});
    const double exposed = (s[0] - comm) / (s[1] - comm);
    if (g->rank() != 0) continue;
    std::printf("%5lld MiB %10.2f %12.2f %12.2f %9.3fx\n", (long long)mib, comm * 1e3, s[0] * 1e3, s[1] * 1e3, exposed);
    std::printf("RESULT engine_exposed_comm_ratio_%lldMiB %.3f\n", (long long)mib, exposed);
    std::fflush(stdout);
  }
  return 0;
}
