// hprun: starts N ranks of a program on this node, like torchrun.
//   hprun --nproc-per-node 4 [--max-restarts K] PROGRAM ARGS...
//   hprun --nnodes 2 --node-rank R --master-addr A --master-port P --nproc-per-node 4 PROGRAM ARGS...
#include <iostream>

#include "hp/base/error.h"
#include "hp/comm/symm/segment.h"
#include "job.h"
#include "options.h"
#include "supervisor.h"

int main(int argc, char** argv) {
  using namespace hp::run;
  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const hp::Error& e) {
    std::cerr << "hprun: " << e.what() << "\n";
    return 2;
  }
  install_interrupt_handlers();
  // What the ranks of a launcher killed with SIGKILL (ours or another run's) left behind.
  hp::symm::reap_orphan_segments();
  std::unique_ptr<Job> job;
  try {
    job = std::make_unique<Job>(opt);
  } catch (const std::exception& e) {
    std::cerr << "hprun: " << e.what() << "\n";
    return 1;
  }
  for (int attempt = 0;; ++attempt) {
    Outcome out = job->end_attempt(attempt, run_attempt(opt, job->port(), attempt, job->link(attempt)));
    if (out.ok) return job->leave(), 0;
    std::cerr << "hprun: " << out.failure << "; stopped the other ranks"
              << (opt.nnodes > 1 ? " on every node\n" : "\n");
    if (out.interrupted || attempt >= opt.max_restarts) {
      if (!out.interrupted && opt.max_restarts > 0)
        std::cerr << "hprun: giving up after " << opt.max_restarts << " restart(s)\n";
      job->leave();
      return out.exit_code ? out.exit_code : 1;
    }
    std::cerr << "hprun: restarting the group (restart " << attempt + 1 << " of " << opt.max_restarts
              << (opt.nnodes > 1 ? ", every node)\n" : ")\n");
  }
}
