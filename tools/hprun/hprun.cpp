// hprun: starts N ranks of a program on this node, like torchrun.
//   hprun --nproc-per-node 4 [--max-restarts K] PROGRAM ARGS...
//   hprun --nnodes 2 --node-rank R --master-addr A --master-port P --nproc-per-node 4 PROGRAM ARGS...
#include <iostream>

#include "hp/base/error.h"
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
  for (int attempt = 0;; ++attempt) {
    // A fresh port per attempt: the last attempt's store may still be closing.
    int port = opt.master_port ? opt.master_port : free_port();
    Outcome out = run_attempt(opt, port, attempt);
    if (out.ok) return 0;
    std::cerr << "hprun: " << out.failure << "; stopped the other ranks\n";
    if (out.interrupted) return out.exit_code;
    if (attempt >= opt.max_restarts) {
      if (opt.max_restarts > 0)
        std::cerr << "hprun: giving up after " << opt.max_restarts << " restart(s)\n";
      return out.exit_code ? out.exit_code : 1;
    }
    std::cerr << "hprun: restarting the group (restart " << attempt + 1 << " of "
              << opt.max_restarts << ")\n";
  }
}
