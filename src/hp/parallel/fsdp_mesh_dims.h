// Which mesh dims of the parameters a dim of fully_shard's mesh stands for. By name: the
// parameters' dim of that name. Flattened (mesh[{"dp", "ep"}].flatten(), named dp_ep, as
// PyTorch's _flatten): the parameters' dims whose names joined with '_' make its name; a
// parameter is then split over all of them at once (Shard on each, nested outer to
// inner, as ShardSpec reads it) and one collective over the flattened group gathers or
// reduces it. With experts over ep, that shards the non-expert parameters over every
// data-parallel rank (torchtitan's dp_shard_in_ep) and reduces their gradients over
// dp x ep in one reduce-scatter. A one-rank dim of another name splits nothing.
#pragma once

#include <optional>
#include <vector>

#include "hp/comm/device_mesh.h"

namespace hp::parallel {

struct FSDPMeshDims {
  std::vector<int> param_dims;  // dims of the parameters' mesh, outer first (none: one rank)
  const comm::Group* group;     // its ranks in the order of the gathered rows
};

// Dim `dim` of `mesh` on `param_mesh`; throws when it is neither a dim of param_mesh nor
// a flattening of some of them (nor one rank).
FSDPMeshDims fsdp_mesh_dims(const DeviceMesh& param_mesh, const DeviceMesh& mesh, int dim);

}  // namespace hp::parallel
