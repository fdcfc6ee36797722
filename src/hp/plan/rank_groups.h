// The rank groups of each parallel dim, laid on the cluster in the order
// pp (outermost), dp, ep, cp (ring, then hybrid's Ulysses), tp (innermost): rank r runs on device r, so a tp group
// takes consecutive devices and stays inside a server when tp divides its fanout.
// Collective costs come only from ClusterTopology::cost over these groups, memoized.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "hp/plan/strategy.h"
#include "hp/topology/cluster.h"
#include "hp/topology/mesh_shape.h"

namespace hp::plan {

// Costs of collectives on concrete rank lists, shared by every mesh a search visits: the
// same group (e.g. ranks 0..7 as tp) recurs across many meshes.
class CostCache {
 public:
  explicit CostCache(const ClusterTopology& topo) : topo_(topo) {}
  const ClusterTopology& topology() const { return topo_; }
  const CollectiveCost& cost(Collective kind, double bytes, const std::vector<int>& ranks);

 private:
  struct Entry {
    Collective kind;
    double bytes;
    std::vector<int> ranks;
    CollectiveCost cost;
  };
  const ClusterTopology& topo_;
  std::unordered_multimap<uint64_t, Entry> entries_;
};

// CpRing and CpUlysses split CP for hybrid context parallelism (the ring outer, Ulysses
// inner); otherwise CpRing is CP and CpUlysses has one rank.
enum class GroupKind { TP, CP, EP, DP, PP, DenseGrad, ExpertGrad, CpRing, CpUlysses };
const char* to_string(GroupKind g);

class RankGroups {
 public:
  // dims of `s` must be resolved (dp > 0).
  RankGroups(CostCache& cache, const Strategy& s);

  int64_t size(GroupKind g) const;
  // Some groups of that kind (rank 0's and a few spread over the mesh: with uneven link
  // alignment, groups of one dim need not cost the same).
  const std::vector<std::vector<int>>& samples(GroupKind g) const;
  // The slowest of the sampled groups; for PP, a send/recv between the slowest pair of
  // neighbouring stages.
  const CollectiveCost& cost(GroupKind g, Collective kind, double bytes);

 private:
  CostCache& cache_;
  MeshShape mesh_;
  std::vector<std::vector<std::vector<int>>> samples_;  // by GroupKind
  std::map<std::tuple<int, int, double>, CollectiveCost> memo_;
};

}  // namespace hp::plan
