// Saving and loading schedules as JSON, so a generated or hand-edited schedule
// can be checked in, diffed, and handed to the runtime.
#pragma once

#include <string>

#include "hp/schedule/action.h"

namespace hp::schedule {

// {"name", "num_ranks", "num_stages", "num_microbatches", "stage_to_rank": [...],
//  "actions": [["F0.0", "SEND_F0.0>1", ...], ...]}
std::string to_json(const Schedule& s);
Schedule schedule_from_json(const std::string& text);  // throws hp::Error on bad input

}  // namespace hp::schedule
