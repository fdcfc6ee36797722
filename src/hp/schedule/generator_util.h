// Shared by the generator files (not part of the public API).
#pragma once

#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/schedule/action.h"

namespace hp::schedule::detail {

// An empty schedule (no actions yet) after checking the sizes every generator needs.
inline Schedule empty_schedule(const std::string& name, int num_ranks, int num_microbatches,
                               std::vector<int> stage_to_rank) {
  HP_CHECK(num_ranks >= 1) << name << ": need at least 1 rank, got " << num_ranks;
  HP_CHECK(num_microbatches >= 1)
      << name << ": need at least 1 microbatch, got " << num_microbatches;
  Schedule s;
  s.name = name;
  s.num_ranks = num_ranks;
  s.num_stages = static_cast<int>(stage_to_rank.size());
  s.num_microbatches = num_microbatches;
  s.stage_to_rank = std::move(stage_to_rank);
  s.actions.resize(num_ranks);
  return s;
}

}  // namespace hp::schedule::detail
