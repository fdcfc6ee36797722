// Starts the local ranks of one attempt, relays their output line by line with a
// rank prefix, and stops every rank as soon as one fails or the user interrupts.
#pragma once

#include <string>

#include "options.h"

namespace hp::run {

struct Outcome {
  bool ok = false;
  bool interrupted = false;  // Ctrl-C or SIGTERM to hprun: never restarted
  int exit_code = 0;         // what hprun should exit with when giving up
  std::string failure;       // "rank 2 (pid 123) was killed by signal 9 (Killed)"
};

// Installs SIGINT/SIGTERM handlers that make running attempts stop their ranks.
void install_interrupt_handlers();

Outcome run_attempt(const Options& opt, int master_port, int restart_count);

// A free TCP port on the loopback interface.
int free_port();

}  // namespace hp::run
