// What the estimator takes from a pipeline schedule: the idle share of a step and each
// rank's peak of live activations. Both come from the schedule the trainer runs
// (hp::schedule::make_schedule), simulated (hp::schedule::simulate), not from closed forms.
//
// Costs of one chunk (a virtual stage) in units of its forward, for recompute share r
// (the extra forward work per forward: 0, the selective share, or 1 under full recompute):
//   F = 1   B = 2 + r   I = 1 + r   W = 1
// The backward is twice the forward, half for the input grads and half for the weight
// grads; recompute runs before the input grads. Every chunk costs the same: the planner
// balances chunks by FLOPs and the estimator paces the step by its slowest rank. Exposed
// communication per microbatch is taken to scale like compute, so it shifts no ratio.
// Transfers are free here; the estimator adds the fill and drain sends itself.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "hp/schedule/simulate.h"

namespace hp::plan {

struct PipelineShape {
  std::string schedule;
  int64_t pp = 1;
  int64_t microbatches = 1;
  int64_t vpp = 1;  // virtual stages per rank
  bool operator<(const PipelineShape& o) const {
    return std::tie(schedule, pp, microbatches, vpp) < std::tie(o.schedule, o.pp, o.microbatches, o.vpp);
  }
};

// F, B, I and W of one chunk for recompute share r, as above.
schedule::StageCost chunk_costs(double recompute_share);

// 1 - busy / (ranks * makespan) of the simulated schedule; 0 when pp == 1.
double pipeline_bubble_fraction(const PipelineShape& shape, double recompute_share);

// Per pipeline rank, the most (stage, microbatch) activations alive at once (forward run,
// B or W not yet), divided by vpp: microbatches through all of the rank's layers. Without
// pipelining the trainer accumulates one microbatch at a time: 1.
std::vector<double> inflight_microbatches(const PipelineShape& shape);

// Both of the above, each simulated once per shape (and recompute share): a search asks
// for the same few shapes thousands of times.
class PipelineProfiles {
 public:
  double bubble_fraction(const PipelineShape& shape, double recompute_share);
  const std::vector<double>& inflight(const PipelineShape& shape);
  size_t computed() const { return bubbles_.size() + inflight_.size(); }  // cache misses so far

 private:
  std::map<std::pair<PipelineShape, double>, double> bubbles_;
  std::map<PipelineShape, std::vector<double>> inflight_;
};

}  // namespace hp::plan
