#include "hp/schedule/execution.h"

#include <algorithm>
#include <sstream>

namespace hp::schedule::detail {

namespace {

struct Message {
  bool posted = false;
  double post = 0;
  int index = 0;  // position among the messages sent on its (src, dst) channel
  bool received = false;
  double received_at = 0;
};

}  // namespace

Execution execute(const Schedule& s, const CostModel& costs) {
  const int p = s.num_ranks;
  Execution ex;
  ex.timeline.assign(p, {});
  for (int r = 0; r < p; ++r) ex.timeline[r].reserve(s.actions[r].size());
  ex.stopped_at.assign(p, 0);
  std::vector<double> clock(p, 0.0);
  // A message is named by its send: (type, stage, microbatch); the stage fixes the
  // sender. Flat tables keep a long schedule's simulation linear in its length.
  const size_t per_type = static_cast<size_t>(s.num_stages) * s.num_microbatches;
  std::vector<Message> messages(2 * per_type);
  auto message_of_send = [&](const Action& send) -> Message& {
    const size_t type = send.type == ActionType::SEND_F ? 0 : 1;
    const size_t stage_mb = static_cast<size_t>(send.stage) * s.num_microbatches + send.microbatch;
    return messages[type * per_type + stage_mb];
  };
  // Per (src, dst) channel, its messages in post order.
  std::vector<std::vector<const Message*>> channels(static_cast<size_t>(p) * p);

  // Runs the action at the head of rank r if it can; false when it must wait.
  auto step = [&](int r) -> bool {
    const Action& a = s.actions[r][ex.stopped_at[r]];
    double end = clock[r];
    if (is_send(a.type)) {
      Message& msg = message_of_send(a);
      auto& channel = channels[static_cast<size_t>(r) * p + a.peer];
      if (!msg.posted) {  // post once; the rank may then wait on it
        msg.posted = true;
        msg.post = clock[r];
        msg.index = static_cast<int>(channel.size());
        channel.push_back(&msg);
      }
      const int cap = costs.send_capacity;
      if (cap == 0) {
        if (!msg.received) return false;
        end = std::max(end, msg.received_at);
      } else if (cap > 0) {
        // Free once at most cap-1 earlier messages to this peer are unreceived.
        const int need = msg.index - cap + 1;
        if (need > 0) {
          std::vector<double> times;
          for (int k = 0; k < msg.index; ++k) {
            const Message& m = *channel[k];
            if (m.received) times.push_back(m.received_at);
          }
          if (static_cast<int>(times.size()) < need) return false;
          std::nth_element(times.begin(), times.begin() + (need - 1), times.end());
          end = std::max(end, times[need - 1]);
        }
      }
    } else if (is_recv(a.type)) {
      const Action send = matching_comm(a, r);
      Message& msg = message_of_send(send);
      if (!msg.posted) return false;
      end = std::max(end, msg.post + costs.latency_of(send.type));
      msg.received = true;
      msg.received_at = end;
    } else {
      end += costs.cost(a);
    }
    ex.timeline[r].push_back({a, clock[r], end});
    clock[r] = end;
    ++ex.stopped_at[r];
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r)
      while (ex.stopped_at[r] < static_cast<int>(s.actions[r].size()) && step(r)) progress = true;
  }

  std::ostringstream why;
  for (int r = 0; r < p; ++r) {
    const int pos = ex.stopped_at[r];
    if (pos >= static_cast<int>(s.actions[r].size())) continue;
    ex.deadlocked = true;
    const Action& a = s.actions[r][pos];
    why << "\n  rank " << r << " position " << pos << ": " << to_string(a);
    if (is_recv(a.type))
      why << " waits for " << to_string(matching_comm(a, r)) << " on rank " << a.peer
          << ", not yet posted";
    else
      why << " waits for rank " << a.peer << " to receive (send capacity "
          << costs.send_capacity << ")";
  }
  ex.blocked = why.str();
  return ex;
}

}  // namespace hp::schedule::detail
