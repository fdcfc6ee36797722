// One step of a redistribution: a change of the placement on a single mesh dim, or on
// several flattened into one, carried out by one collective (or none) inside every group
// along that mesh dim (or those).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hp/layout/mesh_cost.h"
#include "hp/layout/shard_spec.h"

namespace hp {

enum class StepKind {
  AllGather,             // S(concat_dim) -> R: concatenate the group's pieces along concat_dim
  ReduceScatter,         // P(op) -> S(split_dim): reduce, member i keeps chunk i
  AllReduce,             // P(op) -> R
  AllToAll,              // S(concat_dim) -> S(split_dim): member i sends chunk j of its split_dim
                         //   to member j; received pieces are concatenated along concat_dim in order
  LocalChunk,            // R -> S(split_dim): member i keeps chunk i, no communication
  LocalReduceToPartial,  // R -> P(op): sum keeps the value on member 0 and zeroes it elsewhere;
                         //   avg, max, min keep the value everywhere
  LocalScale,            // P(sum) <-> P(avg): multiply by `scale` (group size, or its inverse)
  FlattenedAllToAll,     // several mesh_dims -> S/R there: one all-to-all over their flattened group,
                         //   partial terms reduced by `op`, then times `scale`, on arrival
};
const char* to_string(StepKind k);
bool is_collective(StepKind k);

struct RedistributeStep {
  StepKind kind;
  int mesh_dim;         // the first of mesh_dims for FlattenedAllToAll
  int split_dim = -1;   // tensor dim chunked (ReduceScatter, AllToAll, LocalChunk)
  int concat_dim = -1;  // tensor dim joined (AllGather, AllToAll)
  ReduceOp op = ReduceOp::Sum;  // AllReduce, ReduceScatter, FlattenedAllToAll; the new op for the
                                // Local* partial steps
  double scale = 1.0;           // LocalScale; FlattenedAllToAll (1 / the sizes of its P(avg) dims)
  ShardSpec from;  // the layout before the step, on every rank
  ShardSpec to;    // and after it
  CollectiveCost cost;
  std::vector<int> mesh_dims = {};  // FlattenedAllToAll: the mesh dims flattened, increasing

  std::string to_string() const;  // "all_to_all(mesh 0, split 1, concat 0)"
};

// The step that turns `from`'s placement on `mesh_dim` into `target`, or nullopt when no
// single step can do so without reordering data. Only the innermost mesh dim sharding a
// tensor dim may give it up (gather, all_to_all), and a new shard of a tensor dim must
// come from a mesh dim after every mesh dim already sharding it: the order convention.
// Collective sizes are those of the largest (padded) local piece.
std::optional<RedistributeStep> single_step(const ShardSpec& from, int mesh_dim,
                                            const Placement& target, const MeshCost& cost);

// Groups larger than this are not flattened: pricing one looks at every pair of members.
constexpr int64_t kMaxFlattenedMembers = 64;

// The FlattenedAllToAll over `mesh_dims` (two or more, increasing) from `from` to `to`,
// which differ only there and have no Partial there after; nullopt when it cannot be
// one: a group over kMaxFlattenedMembers, or a group whose part of the tensor (the union
// of its members' pieces) would change, so that data would have to leave it. A Partial
// there before is reduced on arrival: each member takes a piece of every term. Priced on
// the group at coordinate 0 off those dims (the largest pieces), by the exact transfers.
std::optional<RedistributeStep> flattened_step(const ShardSpec& from, const ShardSpec& to,
                                               const std::vector<int>& mesh_dims, const MeshCost& cost);

// Every FlattenedAllToAll over `mesh_dims` out of `from`, to each choice of Replicate or
// Shard on each of them, whose layout after `wanted` accepts (the planner skips layouts it
// has settled before pricing them).
std::vector<RedistributeStep> flattened_steps(const ShardSpec& from, const std::vector<int>& mesh_dims,
                                              const MeshCost& cost,
                                              const std::function<bool(const ShardSpec&)>& wanted);

}  // namespace hp
