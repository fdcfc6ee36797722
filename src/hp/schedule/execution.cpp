#include "hp/schedule/execution.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace hp::schedule::detail {

Messages::Messages(const Schedule& s)
    : s_(s),
      per_type_(static_cast<size_t>(s.num_stages) * s.num_microbatches),
      messages_(2 * per_type_),
      channels_(static_cast<size_t>(s.num_ranks) * s.num_ranks) {}

size_t Messages::index(const Action& send) const {
  const size_t type = send.type == ActionType::SEND_F ? 0 : 1;
  return type * per_type_ + static_cast<size_t>(send.stage) * s_.num_microbatches + send.microbatch;
}

Message& Messages::of_send(const Action& send) { return messages_[index(send)]; }

Message& Messages::post(const Action& send, int src, double t) {
  Message& msg = of_send(send);
  if (!msg.posted) {
    auto& channel = channels_[static_cast<size_t>(src) * s_.num_ranks + send.peer];
    msg.posted = true;
    msg.post = t;
    msg.index = static_cast<int>(channel.size());
    channel.push_back(&msg);
  }
  return msg;
}

bool Messages::free_at(const Action& send, int src, int capacity, double t, double* since) const {
  const Message& msg = messages_[index(send)];
  *since = msg.post;
  if (capacity < 0) return true;
  if (capacity == 0) {
    if (!msg.received || msg.received_at > t) return false;
    *since = msg.received_at;
    return true;
  }
  // Free once at most capacity-1 earlier messages to this peer are unreceived.
  const int need = msg.index - capacity + 1;
  if (need <= 0) return true;
  const auto& channel = channels_[static_cast<size_t>(src) * s_.num_ranks + send.peer];
  std::vector<double> times;
  for (int k = 0; k < msg.index; ++k)
    if (channel[k]->received && channel[k]->received_at <= t) times.push_back(channel[k]->received_at);
  if (static_cast<int>(times.size()) < need) return false;
  std::nth_element(times.begin(), times.begin() + (need - 1), times.end());
  *since = times[need - 1];
  return true;
}

Execution execute(const Schedule& s, const CostModel& costs) {
  const int p = s.num_ranks;
  Execution ex;
  ex.timeline.assign(p, {});
  for (int r = 0; r < p; ++r) ex.timeline[r].reserve(s.actions[r].size());
  ex.stopped_at.assign(p, 0);
  std::vector<double> clock(p, 0.0);
  Messages messages(s);
  constexpr double kEver = std::numeric_limits<double>::infinity();

  // Runs the action at the head of rank r if it can; false when it must wait. Ranks run
  // out of time order, so a send counts every receipt recorded, whenever it happens.
  auto step = [&](int r) -> bool {
    const Action& a = s.actions[r][ex.stopped_at[r]];
    double end = clock[r];
    if (is_send(a.type)) {
      messages.post(a, r, clock[r]);  // once; the rank may then wait on it
      double since = 0;
      if (!messages.free_at(a, r, costs.send_capacity, kEver, &since)) return false;
      end = std::max(end, since);
    } else if (is_recv(a.type)) {
      const Action send = matching_comm(a, r);
      Message& msg = messages.of_send(send);
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
