// Collective costs on the groups along a mesh dim (or along several, flattened), from the
// one cost model (ClusterTopology). Groups with the same link pattern cost the same, so
// only one representative of each pattern is priced: pricing stays cheap on 10^5-rank meshes.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
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
  // The same point-to-point `transfers` inside every group along `mesh_dims` at once
  // (members numbered row-major over those dims, as MeshShape::group_along lists them).
  CollectiveCost exchange(const std::vector<Transfer>& transfers, const std::vector<int>& mesh_dims) const;
  CollectiveCost zero() const;
  const ClusterTopology& topology() const { return topology_; }

 private:
  struct Pattern {
    std::vector<int> group;
    int64_t count;
  };
  // One group per link pattern among the groups along `dims`; computed on first use.
  const std::vector<Pattern>& patterns(const std::vector<int>& dims) const;

  MeshShape mesh_;
  ClusterTopology topology_;
  std::vector<int64_t> units_;  // devices per unit of each topology level
  mutable std::mutex mutex_;
  mutable std::map<std::vector<int>, std::vector<Pattern>> patterns_;
};

}  // namespace hp
