// The execution engine shared by validate() and simulate() (internal).
#pragma once

#include <string>
#include <vector>

#include "hp/schedule/action.h"
#include "hp/schedule/simulate.h"

namespace hp::schedule::detail {

struct Execution {
  std::vector<std::vector<TimedAction>> timeline;  // filled as far as each rank got
  std::vector<int> stopped_at;                     // per rank: first action not run
  bool deadlocked = false;
  std::string blocked;                             // why each stuck rank waits
};

// Runs every rank's list in order, receives blocking until their send posted
// and sends blocking per costs.send_capacity. Assumes matching has been checked.
Execution execute(const Schedule& s, const CostModel& costs);

}  // namespace hp::schedule::detail
