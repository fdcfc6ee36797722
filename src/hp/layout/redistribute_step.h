// One step of a redistribution: a change of the placement on a single mesh dim, carried
// out by one collective (or none) inside every group along that mesh dim.
#pragma once

#include <optional>
#include <string>

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
};
const char* to_string(StepKind k);
bool is_collective(StepKind k);

struct RedistributeStep {
  StepKind kind;
  int mesh_dim;
  int split_dim = -1;   // tensor dim chunked (ReduceScatter, AllToAll, LocalChunk)
  int concat_dim = -1;  // tensor dim joined (AllGather, AllToAll)
  ReduceOp op = ReduceOp::Sum;  // AllReduce, ReduceScatter; the new op for the Local* partial steps
  double scale = 1.0;           // LocalScale
  ShardSpec from;  // the layout before the step, on every rank
  ShardSpec to;    // and after it
  CollectiveCost cost;

  std::string to_string() const;  // "all_to_all(mesh 0, split 1, concat 0)"
};

// The step that turns `from`'s placement on `mesh_dim` into `target`, or nullopt when no
// single step can do so without reordering data. Only the innermost mesh dim sharding a
// tensor dim may give it up (gather, all_to_all), and a new shard of a tensor dim must
// come from a mesh dim after every mesh dim already sharding it: the order convention.
// Collective sizes are those of the largest (padded) local piece.
std::optional<RedistributeStep> single_step(const ShardSpec& from, int mesh_dim,
                                            const Placement& target, const MeshCost& cost);

}  // namespace hp
