#include <algorithm>

#include "hp/schedule/generator_util.h"
#include "hp/schedule/generators.h"

namespace hp::schedule {

Schedule interleaved_1f1b(int num_ranks, int num_microbatches, int stages_per_rank) {
  HP_CHECK(stages_per_rank >= 1)
      << "interleaved-1f1b: need at least 1 stage per rank, got " << stages_per_rank;
  const int p = num_ranks, m = num_microbatches, v = stages_per_rank;
  Schedule s = detail::empty_schedule("interleaved-1f1b", p, m, loop_stage_map(p, v));
  // Microbatches travel in rounds of about p: a round goes through local stage
  // 0 of every rank, then local stage 1, ... so the next round's first stage
  // meets the previous round's return. With m not a multiple of p the
  // max(1, m / p) rounds differ in size by one, the larger first (a short round
  // ahead of a long one would leave the last rank waiting on its own backward).
  const int rounds = std::max(1, m / p);
  std::vector<int> round_start{0};
  for (int k = 0; k < rounds; ++k)
    round_start.push_back(round_start.back() + m / rounds + (k < m % rounds ? 1 : 0));
  for (int r = 0; r < p; ++r) {
    std::vector<Action> fwd, bwd;
    for (int k = 0; k < rounds; ++k) {
      const int first = round_start[k], end = round_start[k + 1];
      for (int c = 0; c < v; ++c)
        for (int mb = first; mb < end; ++mb) fwd.push_back(compute(ActionType::F, c * p + r, mb));
      for (int c = v - 1; c >= 0; --c)
        for (int mb = first; mb < end; ++mb) bwd.push_back(compute(ActionType::B, c * p + r, mb));
    }
    // Warm-up: every local stage but the last sees a full round, plus two
    // forwards per hop to the last rank (one there, one for the backward back).
    const int total = static_cast<int>(fwd.size());
    const int warmup = std::min((v - 1) * round_start[1] + 2 * (p - 1 - r), total);
    auto& list = s.actions[r];
    int f = 0, b = 0;
    while (f < warmup) list.push_back(fwd[f++]);
    while (f < total) {
      list.push_back(fwd[f++]);
      list.push_back(bwd[b++]);
    }
    while (b < total) list.push_back(bwd[b++]);
  }
  return s;
}

}  // namespace hp::schedule
