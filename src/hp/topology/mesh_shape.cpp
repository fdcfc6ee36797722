#include "hp/topology/mesh_shape.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp {

MeshShape::MeshShape(std::vector<int64_t> dims, std::vector<std::string> names,
                     std::vector<int> ranks)
    : dims_(std::move(dims)), names_(std::move(names)), ranks_(std::move(ranks)) {
  HP_CHECK(!dims_.empty()) << "a mesh needs at least one dim";
  int64_t n = 1;
  for (int64_t d : dims_) {
    HP_CHECK(d >= 1) << "mesh dims must be positive, got " << to_string_list(dims_);
    n *= d;
  }
  if (names_.empty())
    for (int i = 0; i < ndim(); ++i) names_.push_back("d" + std::to_string(i));
  HP_CHECK(names_.size() == dims_.size())
      << "mesh has " << dims_.size() << " dims " << to_string_list(dims_) << " but "
      << names_.size() << " names " << to_string_list(names_);
  std::set<std::string> unique(names_.begin(), names_.end());
  HP_CHECK(unique.size() == names_.size()) << "mesh dim names repeat: " << to_string_list(names_);
  if (ranks_.empty()) {
    ranks_.resize(n);
    std::iota(ranks_.begin(), ranks_.end(), 0);
    return;  // 0..n-1 cannot repeat; the planner builds meshes of 10^4+ ranks by the thousand
  }
  HP_CHECK(static_cast<int64_t>(ranks_.size()) == n)
      << "mesh shape " << to_string_list(dims_) << " holds " << n << " ranks, but "
      << ranks_.size() << " ranks were given";
  std::set<int> ur(ranks_.begin(), ranks_.end());
  HP_CHECK(ur.size() == ranks_.size()) << "mesh ranks repeat: " << to_string_list(ranks_);
}

int MeshShape::dim_index(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  HP_CHECK(it != names_.end()) << "mesh has no dim named '" << name << "'; its dims are "
                               << to_string_list(names_);
  return static_cast<int>(it - names_.begin());
}

bool MeshShape::contains(int rank) const {
  return std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end();
}

std::vector<int64_t> MeshShape::coord_of(int rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  HP_CHECK(it != ranks_.end()) << "rank " << rank << " is not in mesh " << to_string();
  int64_t flat = it - ranks_.begin();
  std::vector<int64_t> c(dims_.size());
  for (int d = ndim() - 1; d >= 0; --d) {
    c[d] = flat % dims_[d];
    flat /= dims_[d];
  }
  return c;
}

int MeshShape::rank_at(const std::vector<int64_t>& coord) const {
  HP_CHECK(coord.size() == dims_.size())
      << "coordinate " << to_string_list(coord) << " has the wrong rank for mesh " << to_string();
  int64_t flat = 0;
  for (int d = 0; d < ndim(); ++d) {
    HP_CHECK(coord[d] >= 0 && coord[d] < dims_[d])
        << "coordinate " << to_string_list(coord) << " is outside mesh " << to_string();
    flat = flat * dims_[d] + coord[d];
  }
  return ranks_[flat];
}

std::vector<int> MeshShape::group_along(int rank, const std::vector<int>& dims) const {
  std::vector<int64_t> base = coord_of(rank);
  int64_t count = 1;
  for (int d : dims) {
    HP_CHECK(d >= 0 && d < ndim()) << "mesh dim " << d << " out of range for " << to_string();
    count *= dims_[d];
  }
  std::vector<int> group;
  group.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> c = base;
    int64_t rest = i;
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
      c[dims[k]] = rest % dims_[dims[k]];
      rest /= dims_[dims[k]];
    }
    group.push_back(rank_at(c));
  }
  return group;
}

std::vector<std::vector<int>> MeshShape::groups_along(const std::vector<int>& dims) const {
  std::vector<std::vector<int>> groups;
  std::set<int> seen;
  for (int r : ranks_) {
    if (seen.count(r)) continue;
    groups.push_back(group_along(r, dims));
    seen.insert(groups.back().begin(), groups.back().end());
  }
  return groups;
}

MeshShape MeshShape::submesh(int rank, const std::vector<int>& dims) const {
  std::vector<int64_t> sd;
  std::vector<std::string> sn;
  for (int d : dims) {
    HP_CHECK(d >= 0 && d < ndim()) << "mesh dim " << d << " out of range for " << to_string();
    sd.push_back(dims_[d]);
    sn.push_back(names_[d]);
  }
  return MeshShape(sd, sn, group_along(rank, dims));
}

MeshShape MeshShape::flatten(const std::string& name) const {
  std::string n = name;
  if (n.empty()) {
    for (size_t i = 0; i < names_.size(); ++i) n += (i ? "_" : "") + names_[i];
  }
  return MeshShape({size()}, {n}, ranks_);
}

std::string MeshShape::to_string() const {
  std::ostringstream os;
  os << "Mesh(";
  for (int d = 0; d < ndim(); ++d) os << (d ? ", " : "") << names_[d] << "=" << dims_[d];
  os << "; ranks " << to_string_list(ranks_) << ")";
  return os.str();
}

}  // namespace hp
