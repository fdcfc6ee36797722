// A tensor's layout on a mesh: global shape, element size, the mesh, and one Placement
// per mesh dim. Pure arithmetic on shapes; no data.
//
// Uneven sizes follow PyTorch: n elements split k ways give chunks of ceil(n / k), so
// trailing chunks are short or empty. A tensor dim sharded by several mesh dims is split
// by them successively in increasing mesh-dim order (mesh dim 0 outermost), PyTorch's
// default order: mesh dim a < b means b splits the piece that a already gave the rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "hp/layout/placement.h"
#include "hp/topology/mesh_shape.h"

namespace hp {

struct ChunkRange {
  int64_t offset = 0;
  int64_t size = 0;
};
// Piece `i` of `n` elements split `k` ways: chunks of ceil(n / k), the last ones short or empty.
ChunkRange chunk_range(int64_t n, int64_t k, int64_t i);

// Partial ops that may be pending together: any mix of sum and avg (both linear, so the
// order of reduction does not matter), or one of max / min alone.
bool partial_ops_compatible(const std::vector<Placement>& placements);

class ShardSpec {
 public:
  // Negative shard dims count from the end, as in PyTorch, and are stored normalised.
  ShardSpec(std::vector<int64_t> shape, int64_t elem_size, MeshShape mesh,
            std::vector<Placement> placements);

  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t elem_size() const { return elem_size_; }
  const MeshShape& mesh() const { return mesh_->mesh; }
  const std::vector<Placement>& placements() const { return placements_; }
  const Placement& placement(int mesh_dim) const { return placements_.at(mesh_dim); }
  int64_t numel() const;
  int64_t bytes() const { return numel() * elem_size_; }

  // Mesh dims that shard `tensor_dim`, in increasing (outer to inner) order.
  std::vector<int> mesh_dims_sharding(int tensor_dim) const;
  bool has_partial() const;

  // Local piece of the rank at mesh coordinate `coord` (or global rank `rank`).
  std::vector<int64_t> local_shape(const std::vector<int64_t>& coord) const;
  std::vector<int64_t> global_offset(const std::vector<int64_t>& coord) const;
  int64_t local_numel(const std::vector<int64_t>& coord) const;
  int64_t local_bytes(const std::vector<int64_t>& coord) const { return local_numel(coord) * elem_size_; }
  std::vector<int64_t> local_shape_of_rank(int rank) const;
  std::vector<int64_t> global_offset_of_rank(int rank) const;
  int64_t local_bytes_of_rank(int rank) const;
  // The largest local piece: coordinate 0 holds the first, largest chunk on every dim.
  std::vector<int64_t> max_local_shape() const;
  int64_t max_local_bytes() const;

  // Same tensor and mesh, other placements (validated).
  ShardSpec with_placements(std::vector<Placement> placements) const;

  bool operator==(const ShardSpec& o) const;
  bool operator!=(const ShardSpec& o) const { return !(*this == o); }
  size_t hash() const { return hash_; }
  std::string to_string() const;  // "[8, 6] x4B on (dp=2, tp=2): [S(0), R]"

 private:
  // Shared and hashed once: specs derived from each other never copy a large mesh.
  struct MeshRef {
    MeshShape mesh;
    size_t hash;
  };
  ShardSpec(std::vector<int64_t> shape, int64_t elem_size, std::shared_ptr<const MeshRef> mesh,
            std::vector<Placement> placements);
  void validate_and_hash();

  std::vector<int64_t> shape_;
  int64_t elem_size_;
  std::shared_ptr<const MeshRef> mesh_;
  std::vector<Placement> placements_;
  size_t hash_ = 0;
};

std::ostream& operator<<(std::ostream& os, const ShardSpec& s);

}  // namespace hp

template <>
struct std::hash<hp::ShardSpec> {
  size_t operator()(const hp::ShardSpec& s) const { return s.hash(); }
};
