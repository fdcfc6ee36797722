// Starts the local ranks of one attempt, relays their output line by line with a
// rank prefix, and stops every rank as soon as one fails or the user interrupts.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "options.h"

namespace hp::run {

struct Outcome {
  bool ok = false;
  bool interrupted = false;  // never restarted: Ctrl-C or SIGTERM to hprun, a node lost
  bool store_lost = false;   // node 0's hprun (the job's store) is gone
  int exit_code = 0;         // what hprun should exit with when giving up
  std::string failure;       // "rank 2 (pid 123) on node 1 was killed by signal 9 (Killed)"
};

// How an attempt hears of a failure on another node, and tells them of its own (Job).
struct AttemptLink {
  std::function<std::optional<Outcome>()> remote_failure;  // polled; cheap between polls
  std::function<void(const Outcome&)> report;               // called once, at the first local failure
};

// Installs SIGINT/SIGTERM handlers that make running attempts stop their ranks.
void install_interrupt_handlers();
bool interrupted();  // since the handlers were installed

// Stops every rank of this node once one fails, hprun is interrupted, or `link` hears
// of a failure elsewhere.
Outcome run_attempt(const Options& opt, int master_port, int restart_count, const AttemptLink& link = {});

}  // namespace hp::run
