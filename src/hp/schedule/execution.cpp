#include "hp/schedule/execution.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

namespace hp::schedule::detail {

namespace {

// A message is named by its send: (sender rank, type, stage, microbatch).
using MsgKey = std::tuple<int, int, int, int>;
MsgKey key_of_send(const Action& send, int rank) {
  return {rank, static_cast<int>(send.type), send.stage, send.microbatch};
}

struct Message {
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
  ex.stopped_at.assign(p, 0);
  std::vector<double> clock(p, 0.0);
  std::map<MsgKey, Message> messages;
  std::map<std::pair<int, int>, std::vector<MsgKey>> channels;  // (src, dst) -> messages in post order

  // Runs the action at the head of rank r if it can; false when it must wait.
  auto step = [&](int r) -> bool {
    const Action& a = s.actions[r][ex.stopped_at[r]];
    double end = clock[r];
    if (is_send(a.type)) {
      const MsgKey key = key_of_send(a, r);
      auto& channel = channels[{r, a.peer}];
      auto it = messages.find(key);
      if (it == messages.end()) {  // post once; the rank may then wait on it
        it = messages.emplace(key, Message{clock[r], static_cast<int>(channel.size())}).first;
        channel.push_back(key);
      }
      const int cap = costs.send_capacity;
      if (cap == 0) {
        if (!it->second.received) return false;
        end = std::max(end, it->second.received_at);
      } else if (cap > 0) {
        // Free once at most cap-1 earlier messages to this peer are unreceived.
        const int need = it->second.index - cap + 1;
        if (need > 0) {
          std::vector<double> times;
          for (int k = 0; k < it->second.index; ++k) {
            const Message& m = messages[channel[k]];
            if (m.received) times.push_back(m.received_at);
          }
          if (static_cast<int>(times.size()) < need) return false;
          std::nth_element(times.begin(), times.begin() + (need - 1), times.end());
          end = std::max(end, times[need - 1]);
        }
      }
    } else if (is_recv(a.type)) {
      auto it = messages.find(key_of_send(matching_comm(a, r), a.peer));
      if (it == messages.end()) return false;
      end = std::max(end, it->second.post + costs.latency);
      it->second.received = true;
      it->second.received_at = end;
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
