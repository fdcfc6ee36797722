// Planning a redistribution from one ShardSpec to another (same mesh, same tensor) as a
// list of steps, each priced by the cluster's cost model.
//
// min_cost_plan searches every sequence of valid steps (Dijkstra over placement states):
// single-mesh-dim steps, and all-to-alls over several mesh dims flattened into one group,
// which change the placements on all of them at once (no Replicate in between). It
// returns one of least time, then fewest bytes, then fewest steps.
// per_mesh_dim_plan is PyTorch DTensor's default greedy algorithm, kept as a baseline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hp/layout/redistribute_step.h"

namespace hp {

struct RedistributePlan {
  std::vector<RedistributeStep> steps;
  CollectiveCost cost;  // sum over steps
  std::string to_string() const;
};

// The steps min_cost_plan may take: single-mesh-dim ones only (the search before flattened
// groups, kept as a baseline), or flattened groups as well.
enum class StepSet { SingleMeshDim, All };

RedistributePlan min_cost_plan(const ShardSpec& from, const ShardSpec& to,
                               const ClusterTopology& topology, StepSet steps = StepSet::All);
RedistributePlan min_cost_plan(const ShardSpec& from, const ShardSpec& to);
// Least-cost plans from `from` to each of `targets`, by one search that settles them all:
// each costs what min_cost_plan's does (ties may break otherwise).
std::vector<RedistributePlan> min_cost_plans(const ShardSpec& from, const std::vector<ShardSpec>& targets,
                                             const ClusterTopology& topology, StepSet steps = StepSet::All);

// PyTorch's per-mesh-dim plan: inner to outer, un-shard mesh dims whose tensor dim is
// sharded differently by outer mesh dims; then outer to inner, set each mesh dim to its
// target. Shard -> Partial and max/min changes of a Partial go through Replicate.
RedistributePlan per_mesh_dim_plan(const ShardSpec& from, const ShardSpec& to,
                                   const ClusterTopology& topology);
RedistributePlan per_mesh_dim_plan(const ShardSpec& from, const ShardSpec& to);

// The min-cost plan, cached by (from, to, topology); thread-safe. The default topology is
// ClusterTopology::uniform(mesh size).
std::shared_ptr<const RedistributePlan> plan_redistribute(const ShardSpec& from, const ShardSpec& to,
                                                          const ClusterTopology& topology);
std::shared_ptr<const RedistributePlan> plan_redistribute(const ShardSpec& from, const ShardSpec& to);
size_t redistribute_cache_size();
void clear_redistribute_cache();

}  // namespace hp
