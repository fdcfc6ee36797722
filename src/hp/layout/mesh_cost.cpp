#include "hp/layout/mesh_cost.h"

#include <algorithm>
#include <map>

#include "hp/base/error.h"

namespace hp {

MeshCost::MeshCost(const MeshShape& mesh, ClusterTopology topology)
    : topology_(std::move(topology)), patterns_(mesh.ndim()) {
  // Unit sizes of each level: two ranks meet at the lowest level whose unit holds both.
  std::vector<int64_t> units;
  int64_t unit = 1;
  for (const auto& l : topology_.levels()) units.push_back(unit *= l.fanout);
  const std::vector<int>& ranks = mesh.ranks();
  for (int d = 0; d < mesh.ndim(); ++d) {
    int64_t stride = 1;
    for (int e = d + 1; e < mesh.ndim(); ++e) stride *= mesh.dim_size(e);
    const int64_t k = mesh.dim_size(d);
    // Key of a group: each member's unit at every level, renumbered by first appearance.
    // Equal keys give equal link levels between every pair, hence equal costs.
    std::map<std::vector<int64_t>, size_t> index;
    for (int64_t base = 0; base < mesh.size(); ++base) {
      if ((base / stride) % k != 0) continue;  // one group per position with coordinate 0 on d
      std::vector<int> group(k);
      for (int64_t j = 0; j < k; ++j) group[j] = ranks[base + j * stride];
      std::vector<int64_t> key;
      key.reserve(k * units.size());
      for (int64_t u : units) {
        std::map<int64_t, int64_t> renumber;
        for (int r : group) key.push_back(renumber.emplace(r / u, renumber.size()).first->second);
      }
      auto it = index.find(key);
      if (it == index.end()) {
        index.emplace(std::move(key), patterns_[d].size());
        patterns_[d].push_back({std::move(group), 1});
      } else {
        patterns_[d][it->second].count++;
      }
    }
  }
}

CollectiveCost MeshCost::zero() const {
  CollectiveCost c;
  c.bytes_per_level.assign(topology_.levels().size(), 0.0);
  return c;
}

CollectiveCost MeshCost::cost(Collective kind, double bytes, int mesh_dim) const {
  HP_CHECK(mesh_dim >= 0 && mesh_dim < static_cast<int>(patterns_.size()))
      << "mesh dim " << mesh_dim << " out of range for a " << patterns_.size() << "-D mesh";
  CollectiveCost total = zero();
  for (const auto& p : patterns_[mesh_dim]) {
    CollectiveCost c = topology_.cost(kind, bytes, p.group);
    total.seconds = std::max(total.seconds, c.seconds);
    for (size_t l = 0; l < c.bytes_per_level.size(); ++l)
      total.bytes_per_level[l] += c.bytes_per_level[l] * static_cast<double>(p.count);
  }
  return total;
}

}  // namespace hp
