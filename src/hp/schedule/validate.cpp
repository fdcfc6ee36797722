#include "hp/schedule/validate.h"

#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/schedule/execution.h"

namespace hp::schedule {

namespace {

// "rank 1 position 4 (F2.0)": where a message points.
std::string where(int rank, int pos, const Action& a) {
  return "rank " + std::to_string(rank) + " position " + std::to_string(pos) + " (" +
         to_string(a) + ")";
}

void check_shape(const Schedule& s) {
  HP_CHECK(s.num_ranks >= 1) << "schedule '" << s.name << "': num_ranks=" << s.num_ranks;
  HP_CHECK(s.num_microbatches >= 1)
      << "schedule '" << s.name << "': num_microbatches=" << s.num_microbatches;
  HP_CHECK(static_cast<int>(s.stage_to_rank.size()) == s.num_stages)
      << "schedule '" << s.name << "': stage_to_rank has " << s.stage_to_rank.size()
      << " entries for " << s.num_stages << " stages";
  HP_CHECK(static_cast<int>(s.actions.size()) == s.num_ranks)
      << "schedule '" << s.name << "': " << s.actions.size() << " action lists for "
      << s.num_ranks << " ranks";
  for (int st = 0; st < s.num_stages; ++st)
    HP_CHECK(s.stage_to_rank[st] >= 0 && s.stage_to_rank[st] < s.num_ranks)
        << "schedule '" << s.name << "': stage " << st << " mapped to rank "
        << s.stage_to_rank[st] << ", outside [0, " << s.num_ranks << ")";
}

// Stage and microbatch in range, on its own rank; SEND/RECV between the right ranks.
void check_action(const Schedule& s, int r, int pos, const Action& a) {
  HP_CHECK(a.stage >= 0 && a.stage < s.num_stages)
      << where(r, pos, a) << ": stage outside [0, " << s.num_stages << ")";
  HP_CHECK(a.microbatch >= 0 && a.microbatch < s.num_microbatches)
      << where(r, pos, a) << ": microbatch outside [0, " << s.num_microbatches << ")";
  HP_CHECK(s.rank_of(a.stage) == r)
      << where(r, pos, a) << ": stage " << a.stage << " lives on rank " << s.rank_of(a.stage);
  if (!is_comm(a.type)) return;
  const bool to_next = a.type == ActionType::SEND_F || a.type == ActionType::RECV_B;
  const int other = to_next ? a.stage + 1 : a.stage - 1;
  HP_CHECK(other >= 0 && other < s.num_stages)
      << where(r, pos, a) << ": there is no stage " << other << " to exchange with";
  HP_CHECK(a.peer == s.rank_of(other))
      << where(r, pos, a) << ": stage " << other << " lives on rank " << s.rank_of(other)
      << ", not on peer " << a.peer;
  HP_CHECK(a.peer != r) << where(r, pos, a)
                        << ": stages on the same rank exchange nothing; drop the action";
}

}  // namespace

void validate(const Schedule& s, int send_capacity) {
  check_shape(s);
  // Where each action sits on its rank, by (type, stage, mb); -1 where absent. A flat
  // table keeps checking a long schedule linear in its length.
  const size_t per_type = static_cast<size_t>(s.num_stages) * s.num_microbatches;
  std::vector<int> at((static_cast<size_t>(ActionType::RESHARD) + 1) * per_type, -1);
  auto slot = [&](ActionType t, int st, int mb) -> int& {
    const size_t stage_mb = static_cast<size_t>(st) * s.num_microbatches + mb;
    return at[static_cast<size_t>(t) * per_type + stage_mb];
  };
  // Position of an action on rank r; -1 when absent or when its stage lives elsewhere.
  auto find = [&](int r, ActionType t, int st, int mb) {
    return s.rank_of(st) == r ? slot(t, st, mb) : -1;
  };
  for (int r = 0; r < s.num_ranks; ++r) {
    for (int pos = 0; pos < static_cast<int>(s.actions[r].size()); ++pos) {
      const Action& a = s.actions[r][pos];
      check_action(s, r, pos, a);
      int& seen = slot(a.type, a.stage, a.microbatch);
      HP_CHECK(seen < 0) << where(r, pos, a) << ": duplicate of position " << seen;
      seen = pos;
    }
  }

  // Each (stage, mb): one F, and one B or one I + W.
  for (int st = 0; st < s.num_stages; ++st) {
    const int r = s.rank_of(st);
    for (int mb = 0; mb < s.num_microbatches; ++mb) {
      auto has = [&](ActionType t) { return slot(t, st, mb) >= 0; };
      auto what = [&] {
        return "stage " + std::to_string(st) + " microbatch " + std::to_string(mb) + " on rank " +
               std::to_string(r);
      };
      HP_CHECK(has(ActionType::F)) << what() << ": no F";
      HP_CHECK(has(ActionType::B) != has(ActionType::I))
          << what() << (has(ActionType::B) ? ": both B and I" : ": no B (or I + W)");
      HP_CHECK(has(ActionType::I) == has(ActionType::W))
          << what() << (has(ActionType::I) ? ": I without W" : ": W without I");
    }
  }

  // Every transfer has its partner, and every local order holds.
  const int last = s.num_stages - 1;
  for (int r = 0; r < s.num_ranks; ++r) {
    auto pos_of = [&](ActionType t, int st, int mb) { return find(r, t, st, mb); };
    // Whichever of B or I this stage and microbatch uses.
    auto backward_pos = [&](int st, int mb) {
      const int b = pos_of(ActionType::B, st, mb);
      return b >= 0 ? b : pos_of(ActionType::I, st, mb);
    };
    for (int pos = 0; pos < static_cast<int>(s.actions[r].size()); ++pos) {
      const Action& a = s.actions[r][pos];
      const int st = a.stage, mb = a.microbatch;
      // `need` names the missing action; it is only spelled out on failure.
      auto before = [&](int p, auto need) {
        HP_CHECK(p >= 0 && p < pos) << where(r, pos, a) << ": needs " << need() << " on rank " << r
                                    << (p < 0 ? " before it, found none" : " before it, found it at position " + std::to_string(p));
      };
      auto action = [](ActionType t, int stage, int m, int peer = -1) {
        return [=] { return to_string(Action{t, stage, m, peer}); };
      };
      auto backward_of = [](int stage, int m) {
        return [=] {
          return "the backward (B or I) of stage " + std::to_string(stage) + " microbatch " +
                 std::to_string(m);
        };
      };
      if (is_comm(a.type)) {
        const Action partner = matching_comm(a, r);
        HP_CHECK(find(a.peer, partner.type, partner.stage, partner.microbatch) >= 0)
            << where(r, pos, a) << ": no matching " << to_string(partner) << " on rank " << a.peer;
      }
      switch (a.type) {
        case ActionType::F:
          if (st > 0) {
            if (s.rank_of(st - 1) == r)
              before(pos_of(ActionType::F, st - 1, mb), action(ActionType::F, st - 1, mb));
            else
              before(pos_of(ActionType::RECV_F, st, mb),
                     action(ActionType::RECV_F, st, mb, s.rank_of(st - 1)));
          }
          break;
        case ActionType::B:
        case ActionType::I:
          before(pos_of(ActionType::F, st, mb), action(ActionType::F, st, mb));
          if (st < last) {
            if (s.rank_of(st + 1) == r)
              before(backward_pos(st + 1, mb), backward_of(st + 1, mb));
            else
              before(pos_of(ActionType::RECV_B, st, mb),
                     action(ActionType::RECV_B, st, mb, s.rank_of(st + 1)));
          }
          break;
        case ActionType::W:
          before(pos_of(ActionType::I, st, mb), action(ActionType::I, st, mb));
          break;
        case ActionType::SEND_F:
          before(pos_of(ActionType::F, st, mb), action(ActionType::F, st, mb));
          break;
        case ActionType::SEND_B:
          before(backward_pos(st, mb), backward_of(st, mb));
          break;
        default:
          break;
      }
    }
  }

  CostModel zero;
  zero.uniform = StageCost{0, 0, 0, 0};
  zero.send_capacity = send_capacity;
  const detail::Execution ex = detail::execute(s, zero);
  HP_CHECK(!ex.deadlocked) << "schedule '" << s.name << "' deadlocks ("
                           << (send_capacity < 0    ? std::string("non-blocking sends")
                               : send_capacity == 0 ? std::string("rendezvous sends")
                                                 : "sends block beyond " +
                                                       std::to_string(send_capacity) +
                                                       " unreceived messages")
                           << "):" << ex.blocked;
}

}  // namespace hp::schedule
