#include <algorithm>

#include "hp/schedule/generator_util.h"
#include "hp/schedule/generators.h"

namespace hp::schedule {

Schedule one_f_one_b(int num_ranks, int num_microbatches) {
  Schedule s = detail::empty_schedule("1f1b", num_ranks, num_microbatches,
                                      loop_stage_map(num_ranks));
  const int m = num_microbatches;
  for (int r = 0; r < num_ranks; ++r) {
    auto& list = s.actions[r];
    // Enough forwards in flight that the first backward arrives just as the
    // last warm-up forward ends.
    const int warmup = std::min(num_ranks - 1 - r, m);
    int f = 0, b = 0;
    while (f < warmup) list.push_back(compute(ActionType::F, r, f++));
    while (f < m) {
      list.push_back(compute(ActionType::F, r, f++));
      list.push_back(compute(ActionType::B, r, b++));
    }
    while (b < m) list.push_back(compute(ActionType::B, r, b++));
  }
  return s;
}

}  // namespace hp::schedule
