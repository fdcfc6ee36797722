#include <algorithm>

#include "hp/schedule/generator_util.h"
#include "hp/schedule/generators.h"

namespace hp::schedule {

Schedule zb_h1(int num_ranks, int num_microbatches) {
  const int p = num_ranks, m = num_microbatches;
  Schedule s = detail::empty_schedule("zb-h1", p, m, loop_stage_map(p));
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[r];
    const int warmup = std::min(p - 1 - r, m);
    // Rank r runs 1F1B with p-1-r warm-up forwards; holding back up to r weight
    // grads keeps its in-flight count at p, like rank 0, while its input grads
    // reach the upstream ranks sooner. The held W's fill the drain at the end.
    const int defer = r;
    int f = 0, i = 0, w = 0;
    auto backward = [&] {
      list.push_back(compute(ActionType::I, r, i++));
      if (i - w > defer) list.push_back(compute(ActionType::W, r, w++));
    };
    while (f < warmup) list.push_back(compute(ActionType::F, r, f++));
    while (f < m) {
      list.push_back(compute(ActionType::F, r, f++));
      backward();
    }
    while (i < m) backward();
    while (w < m) list.push_back(compute(ActionType::W, r, w++));
  }
  return s;
}

}  // namespace hp::schedule
