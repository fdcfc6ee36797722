#include "hp/schedule/simulate.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/schedule/execution.h"
#include "hp/schedule/validate.h"

namespace hp::schedule {

const StageCost& CostModel::stage(int s) const {
  if (per_stage.empty()) return uniform;
  HP_CHECK(s >= 0 && s < static_cast<int>(per_stage.size()))
      << "no cost for stage " << s << ": per_stage has " << per_stage.size() << " entries";
  return per_stage[s];
}

double CostModel::cost(const Action& a) const {
  switch (a.type) {
    case ActionType::F: return stage(a.stage).f;
    case ActionType::B: return stage(a.stage).b;
    case ActionType::I: return stage(a.stage).i;
    case ActionType::W: return stage(a.stage).w;
    default: return 0;
  }
}

double CostModel::host_share_of(int s) const {
  if (host_share.empty()) return 1;
  HP_CHECK(s >= 0 && s < static_cast<int>(host_share.size()))
      << "no host share for stage " << s << ": host_share has " << host_share.size() << " entries";
  return host_share[s];
}

double CostModel::latency_of(ActionType send) const {
  return send == ActionType::SEND_F && activation_latency >= 0 ? activation_latency : latency;
}

std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> peak(s.actions.size(), 0);
  for (size_t r = 0; r < s.actions.size(); ++r) {
    int live = 0;
    for (const Action& a : s.actions[r]) {
      if (a.type == ActionType::F) peak[r] = std::max(peak[r], ++live);
      if (a.type == ActionType::B || a.type == ActionType::W) --live;
    }
  }
  return peak;
}

SimResult simulate(const Schedule& s, const CostModel& costs) {
  validate(s, costs.send_capacity);
  HP_CHECK(costs.per_stage.empty() || static_cast<int>(costs.per_stage.size()) == s.num_stages)
      << "cost model has " << costs.per_stage.size() << " stage costs for " << s.num_stages
      << " stages";
  HP_CHECK(costs.latency >= 0) << "negative latency " << costs.latency;
  HP_CHECK(costs.cores >= 0) << "negative core count " << costs.cores;
  HP_CHECK(costs.host_share.empty() || static_cast<int>(costs.host_share.size()) == s.num_stages)
      << "cost model has " << costs.host_share.size() << " host shares for " << s.num_stages << " stages";
  for (double h : costs.host_share) HP_CHECK(h >= 0 && h <= 1) << "host share " << h << " is not in [0, 1]";
  detail::Execution ex = detail::execute(s, costs);
  HP_CHECK(!ex.deadlocked) << "schedule '" << s.name << "' deadlocks:" << ex.blocked;
  if (costs.cores > 0 && costs.cores < s.num_ranks) ex = detail::execute_on_cores(s, costs);

  SimResult res;
  res.timeline = std::move(ex.timeline);
  res.busy.assign(s.num_ranks, 0.0);
  for (int r = 0; r < s.num_ranks; ++r)
    for (const TimedAction& t : res.timeline[r]) {
      res.makespan = std::max(res.makespan, t.end);
      if (is_compute(t.action.type)) res.busy[r] += t.end - t.start;
    }
  double busy = 0;
  for (double b : res.busy) busy += b;
  res.bubble_ratio = res.makespan > 0 ? 1.0 - busy / (s.num_ranks * res.makespan) : 0.0;
  res.peak_in_flight = peak_in_flight(s);
  return res;
}

}  // namespace hp::schedule
