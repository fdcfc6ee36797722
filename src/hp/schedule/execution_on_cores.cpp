// Ranks sharing cores: a time-ordered run of the schedule in which the host part of each
// compute action needs a core (processor sharing among the ranks in theirs), and the rest,
// the time a rank waits on its accelerator, does not.
#include <algorithm>
#include <limits>

#include "hp/base/error.h"
#include "hp/schedule/execution.h"

namespace hp::schedule::detail {

namespace {

struct RankState {
  size_t pos = 0;
  double reached = 0;  // when the rank reached the action at pos
  bool computing = false;
  double host_left = 0, device_left = 0;  // of the compute action at pos
};

// Remaining work below this is done: rates and times are sums of doubles.
bool done(double left, double scale) { return left <= 1e-12 * std::max(1.0, scale); }

}  // namespace

Execution execute_on_cores(const Schedule& s, const CostModel& costs) {
  HP_CHECK(costs.cores > 0) << "execute_on_cores needs cores > 0, not " << costs.cores;
  const int p = s.num_ranks;
  Execution ex;
  ex.timeline.assign(p, {});
  std::vector<RankState> rank(p);
  Messages messages(s);
  double now = 0;

  // Runs the zero-time actions of rank r that can complete at `now`, and starts its next
  // compute action; false when it did nothing.
  auto advance = [&](int r) {
    RankState& st = rank[r];
    bool moved = false;
    while (!st.computing && st.pos < s.actions[r].size()) {
      const Action& a = s.actions[r][st.pos];
      if (is_compute(a.type)) {
        const double cost = costs.cost(a);
        st.computing = true;
        st.host_left = cost * costs.host_share_of(a.stage);
        st.device_left = cost - st.host_left;
        return true;
      }
      double end = st.reached;
      if (is_send(a.type)) {
        messages.post(a, r, st.reached);
        double since = 0;
        if (!messages.free_at(a, r, costs.send_capacity, now, &since)) return moved;
        end = std::max(end, since);
      } else {
        const Action send = matching_comm(a, r);
        Message& msg = messages.of_send(send);
        const double arrives = msg.post + costs.latency_of(send.type);
        if (!msg.posted || arrives > now) return moved;
        end = std::max(end, arrives);
        msg.received = true;
        msg.received_at = end;
      }
      ex.timeline[r].push_back({a, st.reached, end});
      st.reached = end;
      ++st.pos;
      moved = true;
    }
    return moved;
  };

  for (;;) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < p; ++r) moved = advance(r) || moved;
    }
    // The next event: a host part or a device part ending, or a message arriving.
    int on_host = 0;
    for (const RankState& st : rank) on_host += st.computing && st.host_left > 0;
    const double rate = on_host > costs.cores ? double(costs.cores) / on_host : 1.0;
    double next = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      const RankState& st = rank[r];
      if (st.computing) {
        next = std::min(next, now + (st.host_left > 0 ? st.host_left / rate : st.device_left));
      } else if (st.pos < s.actions[r].size() && is_recv(s.actions[r][st.pos].type)) {
        const Action send = matching_comm(s.actions[r][st.pos], r);
        const Message& msg = messages.of_send(send);
        if (msg.posted) next = std::min(next, msg.post + costs.latency_of(send.type));
      }
    }
    if (next == std::numeric_limits<double>::infinity()) break;  // every rank is through
    const double dt = next - now;
    now = next;
    for (int r = 0; r < p; ++r) {
      RankState& st = rank[r];
      if (!st.computing) continue;
      if (st.host_left > 0) {
        st.host_left -= rate * dt;
        if (done(st.host_left, now)) st.host_left = 0;
      } else {
        st.device_left -= dt;
      }
      if (st.host_left == 0 && done(st.device_left, now)) {
        ex.timeline[r].push_back({s.actions[r][st.pos], st.reached, now});
        st.reached = now;
        st.computing = false;
        ++st.pos;
      }
    }
  }
  ex.stopped_at.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    ex.stopped_at[r] = static_cast<int>(rank[r].pos);
    HP_CHECK(rank[r].pos == s.actions[r].size())
        << "schedule '" << s.name << "' on " << costs.cores << " cores: rank " << r << " stops at position "
        << rank[r].pos;
  }
  return ex;
}

}  // namespace hp::schedule::detail
