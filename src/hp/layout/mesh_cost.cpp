#include "hp/layout/mesh_cost.h"

#include <algorithm>

#include "hp/base/error.h"

namespace hp {

MeshCost::MeshCost(const MeshShape& mesh, ClusterTopology topology)
    : mesh_(mesh), topology_(std::move(topology)) {
  // Two ranks meet at the lowest level whose unit holds both.
  int64_t unit = 1;
  for (const auto& l : topology_.levels()) units_.push_back(unit *= l.fanout);
}

const std::vector<MeshCost::Pattern>& MeshCost::patterns(const std::vector<int>& dims) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = patterns_.find(dims);
  if (found != patterns_.end()) return found->second;
  for (int d : dims)
    HP_CHECK(d >= 0 && d < mesh_.ndim()) << "mesh dim " << d << " out of range for a " << mesh_.ndim() << "-D mesh";
  std::vector<Pattern>& out = patterns_[dims];
  // Strides of the mesh's row-major positions, to visit each group once: from every
  // position with coordinate 0 on all of `dims`.
  std::vector<int64_t> stride(mesh_.ndim(), 1);
  for (int e = mesh_.ndim() - 2; e >= 0; --e) stride[e] = stride[e + 1] * mesh_.dim_size(e + 1);
  int64_t members = 1;
  for (int d : dims) members *= mesh_.dim_size(d);
  const std::vector<int>& ranks = mesh_.ranks();
  // Key of a group: each member's unit at every level, renumbered by first appearance.
  // Equal keys give equal link levels between every pair, hence equal costs.
  std::map<std::vector<int64_t>, size_t> index;
  for (int64_t base = 0; base < mesh_.size(); ++base) {
    bool first = true;
    for (int d : dims) first = first && (base / stride[d]) % mesh_.dim_size(d) == 0;
    if (!first) continue;
    std::vector<int> group(members);
    for (int64_t j = 0; j < members; ++j) {
      int64_t pos = base, rest = j;
      for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
        pos += (rest % mesh_.dim_size(dims[k])) * stride[dims[k]];
        rest /= mesh_.dim_size(dims[k]);
      }
      group[j] = ranks[pos];
    }
    std::vector<int64_t> key;
    key.reserve(members * units_.size());
    for (int64_t u : units_) {
      std::map<int64_t, int64_t> renumber;
      for (int r : group) key.push_back(renumber.emplace(r / u, renumber.size()).first->second);
    }
    auto it = index.find(key);
    if (it == index.end()) {
      index.emplace(std::move(key), out.size());
      out.push_back({std::move(group), 1});
    } else {
      out[it->second].count++;
    }
  }
  return out;
}

CollectiveCost MeshCost::zero() const {
  CollectiveCost c;
  c.bytes_per_level.assign(topology_.levels().size(), 0.0);
  return c;
}

CollectiveCost MeshCost::cost(Collective kind, double bytes, int mesh_dim) const {
  HP_CHECK(mesh_dim >= 0 && mesh_dim < mesh_.ndim())
      << "mesh dim " << mesh_dim << " out of range for a " << mesh_.ndim() << "-D mesh";
  CollectiveCost total = zero();
  for (const auto& p : patterns({mesh_dim})) {
    CollectiveCost c = topology_.cost(kind, bytes, p.group);
    total.seconds = std::max(total.seconds, c.seconds);
    for (size_t l = 0; l < c.bytes_per_level.size(); ++l)
      total.bytes_per_level[l] += c.bytes_per_level[l] * static_cast<double>(p.count);
  }
  return total;
}

CollectiveCost MeshCost::exchange(const std::vector<Transfer>& transfers, const std::vector<int>& mesh_dims) const {
  CollectiveCost total = zero();
  for (const auto& p : patterns(mesh_dims)) {
    CollectiveCost c = topology_.exchange_cost(p.group, transfers);
    total.seconds = std::max(total.seconds, c.seconds);
    for (size_t l = 0; l < c.bytes_per_level.size(); ++l)
      total.bytes_per_level[l] += c.bytes_per_level[l] * static_cast<double>(p.count);
  }
  return total;
}

}  // namespace hp
