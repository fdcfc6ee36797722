// The rank groups of each parallel dim, laid on the cluster in the order
// pp (outermost), dp, ep, cp, tp (innermost): rank r runs on device r, so a tp group
// takes consecutive devices and stays inside a server when tp divides its fanout.
// Collective costs come only from ClusterTopology::cost over these groups, memoized.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "hp/plan/strategy.h"
#include "hp/topology/cluster.h"
#include "hp/topology/mesh_shape.h"

namespace hp::plan {

enum class GroupKind { TP, CP, EP, DP, PP, DenseGrad, ExpertGrad };
const char* to_string(GroupKind g);

class RankGroups {
 public:
  // dims of `s` must be resolved (dp > 0).
  RankGroups(const ClusterTopology& topo, const Strategy& s);

  int64_t size(GroupKind g) const;
  // Some groups of that kind (rank 0's and a few spread over the mesh: with uneven link
  // alignment, groups of one dim need not cost the same).
  const std::vector<std::vector<int>>& samples(GroupKind g) const;
  // The slowest of the sampled groups; for PP, a send/recv between the slowest pair of
  // neighbouring stages.
  const CollectiveCost& cost(GroupKind g, Collective kind, double bytes);

 private:
  const ClusterTopology& topo_;
  MeshShape mesh_;
  std::vector<std::vector<std::vector<int>>> samples_;  // by GroupKind
  std::map<std::tuple<int, int, double>, CollectiveCost> memo_;
};

}  // namespace hp::plan
