// Collective costs on the groups along a mesh dim, from the one cost model
// (ClusterTopology::cost). Groups with the same link pattern cost the same, so only one
// representative of each pattern is priced: pricing stays cheap on 10^5-rank meshes.
#pragma once

#include <cstdint>
#include <vector>

#include "hp/topology/cluster.h"
#include "hp/topology/mesh_shape.h"

namespace hp {

class MeshCost {
 public:
  MeshCost(const MeshShape& mesh, ClusterTopology topology);

  // A collective run by every group along `mesh_dim` at once, `bytes` per group as
  // ClusterTopology::cost defines it. Seconds: the slowest group; bytes: all groups.
  CollectiveCost cost(Collective kind, double bytes, int mesh_dim) const;
  CollectiveCost zero() const;
  const ClusterTopology& topology() const { return topology_; }

 private:
  struct Pattern {
    std::vector<int> group;
    int64_t count;
  };
  ClusterTopology topology_;
  std::vector<std::vector<Pattern>> patterns_;  // per mesh dim
};

}  // namespace hp
