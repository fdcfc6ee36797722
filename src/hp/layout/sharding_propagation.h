// Sharding propagation: given an op and its inputs' layouts, choose one signature per mesh
// dim so that redistributing the inputs costs least (planner costs, default topology),
// and report the layouts the inputs must take and the output's layout. Cached by
// (op, input specs): on the hot path it is a hash lookup.
#pragma once

#include <memory>
#include <vector>

#include "hp/layout/redistribute_plan.h"
#include "hp/layout/sharding_rules.h"

namespace hp {

struct ShardingDecision {
  std::vector<Signature> per_mesh_dim;  // the chosen signature of each mesh dim
  std::vector<ShardSpec> inputs;        // layouts the inputs are redistributed to
  ShardSpec output;
  CollectiveCost cost;                  // of redistributing all inputs
};

std::shared_ptr<const ShardingDecision> propagate(const Op& op, const std::vector<ShardSpec>& inputs);
size_t propagation_cache_size();
void clear_propagation_cache();

}  // namespace hp
