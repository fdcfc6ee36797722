#include "hp/base/error.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/lower.h"

namespace hp::schedule {

std::vector<std::string> schedule_kinds() {
  return {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"};
}

Schedule make_schedule(const std::string& kind, int num_ranks, int num_microbatches,
                       int stages_per_rank) {
  auto single = [&] {
    HP_CHECK(stages_per_rank <= 1) << kind << " has one stage per rank; got stages_per_rank="
                                   << stages_per_rank << " (use interleaved-1f1b)";
  };
  auto on_the_v = [&] {
    HP_CHECK(stages_per_rank == 0 || stages_per_rank == 2)
        << kind << " always has 2 stages per rank; got stages_per_rank=" << stages_per_rank;
  };
  Schedule s;
  if (kind == "gpipe") {
    single();
    s = gpipe(num_ranks, num_microbatches);
  } else if (kind == "1f1b") {
    single();
    s = one_f_one_b(num_ranks, num_microbatches);
  } else if (kind == "interleaved-1f1b") {
    s = interleaved_1f1b(num_ranks, num_microbatches, stages_per_rank > 0 ? stages_per_rank : 2);
  } else if (kind == "zb-h1") {
    single();
    s = zb_h1(num_ranks, num_microbatches);
  } else if (kind == "zbv") {
    on_the_v();
    s = zbv(num_ranks, num_microbatches);
  } else if (kind == "dualpipev") {
    on_the_v();
    s = dualpipev(num_ranks, num_microbatches);
  } else {
    std::string known;
    for (const auto& k : schedule_kinds()) known += (known.empty() ? "" : ", ") + k;
    HP_FAIL() << "unknown schedule kind '" << kind << "'; known kinds: " << known;
  }
  return lower_communication(s);
}

}  // namespace hp::schedule
