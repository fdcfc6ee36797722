// The shape of a device mesh: an n-D grid of global ranks with named dims.
// Pure arithmetic; the comm layer's DeviceMesh attaches process groups to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hp {

class MeshShape {
 public:
  // `ranks` lists the global rank at each mesh position in row-major order;
  // empty means 0..size-1. Empty `names` get "d0", "d1", ...
  MeshShape(std::vector<int64_t> dims, std::vector<std::string> names = {},
            std::vector<int> ranks = {});

  int ndim() const { return static_cast<int>(dims_.size()); }
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  const std::vector<int64_t>& dims() const { return dims_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<int>& ranks() const { return ranks_; }
  int64_t dim_size(int d) const { return dims_.at(d); }

  int dim_index(const std::string& name) const;  // throws naming the known dims
  bool contains(int rank) const;
  std::vector<int64_t> coord_of(int rank) const;  // throws if rank is not in the mesh
  int rank_at(const std::vector<int64_t>& coord) const;

  // Ranks that share `rank`'s coordinates outside `dims`, in row-major order over `dims`.
  std::vector<int> group_along(int rank, const std::vector<int>& dims) const;
  // Every such group, each once.
  std::vector<std::vector<int>> groups_along(const std::vector<int>& dims) const;
  // The sub-mesh over `dims` that contains `rank`.
  MeshShape submesh(int rank, const std::vector<int>& dims) const;
  // All dims merged into one named `name` (row-major order of ranks kept).
  MeshShape flatten(const std::string& name = "") const;

  bool operator==(const MeshShape& o) const {
    return dims_ == o.dims_ && ranks_ == o.ranks_;
  }
  bool operator!=(const MeshShape& o) const { return !(*this == o); }
  std::string to_string() const;

 private:
  std::vector<int64_t> dims_;
  std::vector<std::string> names_;
  std::vector<int> ranks_;
};

}  // namespace hp
