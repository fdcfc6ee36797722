#include "hp/schedule/generator_util.h"
#include "hp/schedule/generators.h"

namespace hp::schedule {

Schedule gpipe(int num_ranks, int num_microbatches) {
  Schedule s = detail::empty_schedule("gpipe", num_ranks, num_microbatches,
                                      loop_stage_map(num_ranks));
  for (int r = 0; r < num_ranks; ++r) {
    for (int mb = 0; mb < num_microbatches; ++mb) s.actions[r].push_back(compute(ActionType::F, r, mb));
    for (int mb = 0; mb < num_microbatches; ++mb) s.actions[r].push_back(compute(ActionType::B, r, mb));
  }
  return s;
}

}  // namespace hp::schedule
