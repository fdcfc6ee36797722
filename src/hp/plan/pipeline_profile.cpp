#include "hp/plan/pipeline_profile.h"

#include "hp/base/error.h"
#include "hp/schedule/generators.h"

namespace hp::plan {

namespace {

schedule::Schedule generate(const PipelineShape& s) {
  HP_CHECK(s.pp >= 2 && s.microbatches >= 1 && s.vpp >= 1)
      << "pipeline schedule: expected pp >= 2, microbatches >= 1, vpp >= 1, found " << s.pp << ", "
      << s.microbatches << ", " << s.vpp;
  return schedule::make_schedule(s.schedule, int(s.pp), int(s.microbatches), int(s.vpp));
}

}  // namespace

schedule::StageCost chunk_costs(double recompute_share) {
  schedule::StageCost c;
  c.f = 1;
  c.i = 1 + recompute_share;
  c.w = 1;
  c.b = c.i + c.w;
  return c;
}

double pipeline_bubble_fraction(const PipelineShape& shape, double recompute_share) {
  if (shape.pp == 1) return 0;
  schedule::CostModel costs;
  costs.uniform = chunk_costs(recompute_share);
  return schedule::simulate(generate(shape), costs).bubble_ratio;
}

std::vector<double> inflight_microbatches(const PipelineShape& shape) {
  if (shape.pp == 1) return {1.0};
  const schedule::Schedule s = generate(shape);
  const double per_rank = double(s.num_stages) / double(s.num_ranks);  // vpp, 2 on the V
  std::vector<double> r;
  for (int peak : schedule::peak_in_flight(s)) r.push_back(peak / per_rank);
  return r;
}

double PipelineProfiles::bubble_fraction(const PipelineShape& shape, double recompute_share) {
  const auto key = std::make_pair(shape, recompute_share);
  auto it = bubbles_.find(key);
  if (it == bubbles_.end()) it = bubbles_.emplace(key, pipeline_bubble_fraction(shape, recompute_share)).first;
  return it->second;
}

const std::vector<double>& PipelineProfiles::inflight(const PipelineShape& shape) {
  auto it = inflight_.find(shape);
  if (it == inflight_.end()) it = inflight_.emplace(shape, inflight_microbatches(shape)).first;
  return it->second;
}

}  // namespace hp::plan
