#include "hp/schedule/lower.h"

#include "hp/base/error.h"

namespace hp::schedule {

Schedule lower_communication(const Schedule& in) {
  HP_CHECK(!in.has_comm()) << "schedule '" << in.name
                           << "' already has SEND/RECV actions; lower it only once";
  Schedule out = in;
  const int last = in.num_stages - 1;
  for (int r = 0; r < in.num_ranks; ++r) {
    std::vector<Action>& list = out.actions[r];
    list.clear();
    for (const Action& a : in.actions[r]) {
      const int s = a.stage, mb = a.microbatch;
      const bool backward = a.type == ActionType::B || a.type == ActionType::I;
      if (a.type == ActionType::F && s > 0 && in.rank_of(s - 1) != r)
        list.push_back({ActionType::RECV_F, s, mb, in.rank_of(s - 1)});
      if (backward && s < last && in.rank_of(s + 1) != r)
        list.push_back({ActionType::RECV_B, s, mb, in.rank_of(s + 1)});
      list.push_back(a);
      if (a.type == ActionType::F && s < last && in.rank_of(s + 1) != r)
        list.push_back({ActionType::SEND_F, s, mb, in.rank_of(s + 1)});
      if (backward && s > 0 && in.rank_of(s - 1) != r)
        list.push_back({ActionType::SEND_B, s, mb, in.rank_of(s - 1)});
    }
  }
  return out;
}

}  // namespace hp::schedule
