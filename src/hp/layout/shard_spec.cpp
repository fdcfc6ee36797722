#include "hp/layout/shard_spec.h"

#include <algorithm>
#include <ostream>
#include <sstream>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp {
namespace {

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

size_t hash_mesh(const MeshShape& m) {
  size_t h = 0;
  for (int64_t d : m.dims()) h = mix(h, static_cast<size_t>(d));
  for (int r : m.ranks()) h = mix(h, static_cast<size_t>(r));
  return h;
}

std::string placements_string(const std::vector<Placement>& ps) { return to_string_list(ps); }

}  // namespace

ChunkRange chunk_range(int64_t n, int64_t k, int64_t i) {
  HP_CHECK(n >= 0 && k >= 1 && i >= 0 && i < k)
      << "chunk " << i << " of " << n << " elements split " << k << " ways is out of range";
  const int64_t c = (n + k - 1) / k;
  const int64_t begin = std::min(n, i * c);
  const int64_t end = std::min(n, begin + c);
  return {begin, end - begin};
}

bool partial_ops_compatible(const std::vector<Placement>& placements) {
  bool linear = false, other = false;
  ReduceOp first = ReduceOp::Sum;
  for (const auto& p : placements) {
    if (!p.is_partial()) continue;
    if (p.op() == ReduceOp::Sum || p.op() == ReduceOp::Avg) {
      linear = true;
    } else {
      if (other && p.op() != first) return false;
      first = p.op();
      other = true;
    }
  }
  return !(linear && other);
}

ShardSpec::ShardSpec(std::vector<int64_t> shape, int64_t elem_size, MeshShape mesh,
                     std::vector<Placement> placements)
    : shape_(std::move(shape)), elem_size_(elem_size), placements_(std::move(placements)) {
  size_t h = hash_mesh(mesh);
  mesh_ = std::make_shared<const MeshRef>(MeshRef{std::move(mesh), h});
  validate_and_hash();
}

ShardSpec::ShardSpec(std::vector<int64_t> shape, int64_t elem_size,
                     std::shared_ptr<const MeshRef> mesh, std::vector<Placement> placements)
    : shape_(std::move(shape)), elem_size_(elem_size), mesh_(std::move(mesh)),
      placements_(std::move(placements)) {
  validate_and_hash();
}

void ShardSpec::validate_and_hash() {
  const MeshShape& m = mesh_->mesh;
  HP_CHECK(elem_size_ >= 1) << "element size must be >= 1 byte, found " << elem_size_;
  for (int64_t d : shape_)
    HP_CHECK(d >= 0) << "tensor shape " << to_string_list(shape_) << " has a negative dim";
  HP_CHECK(static_cast<int>(placements_.size()) == m.ndim())
      << "expected one placement per mesh dim: mesh " << to_string_list(m.dims()) << " has "
      << m.ndim() << " dims, found " << placements_.size() << " placements "
      << placements_string(placements_);
  for (size_t i = 0; i < placements_.size(); ++i) {
    Placement& p = placements_[i];
    if (!p.is_shard()) continue;
    int d = p.dim() < 0 ? p.dim() + ndim() : p.dim();
    HP_CHECK(d >= 0 && d < ndim())
        << "mesh dim " << i << " shards tensor dim " << p.dim() << " but shape "
        << to_string_list(shape_) << " has " << ndim() << " dims";
    p = Shard(d);
  }
  HP_CHECK(partial_ops_compatible(placements_))
      << "placements " << placements_string(placements_)
      << " mix partial ops; expected any of sum/avg together, or max or min alone";
  size_t h = mix(mesh_->hash, static_cast<size_t>(elem_size_));
  for (int64_t d : shape_) h = mix(h, static_cast<size_t>(d));
  for (const auto& p : placements_) h = mix(h, p.hash());
  hash_ = h;
}

int64_t ShardSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

std::vector<int> ShardSpec::mesh_dims_sharding(int tensor_dim) const {
  std::vector<int> dims;
  for (int i = 0; i < static_cast<int>(placements_.size()); ++i)
    if (placements_[i].is_shard(tensor_dim)) dims.push_back(i);
  return dims;
}

bool ShardSpec::has_partial() const {
  return std::any_of(placements_.begin(), placements_.end(),
                     [](const Placement& p) { return p.is_partial(); });
}

std::vector<int64_t> ShardSpec::local_shape(const std::vector<int64_t>& coord) const {
  const MeshShape& m = mesh();
  HP_CHECK(static_cast<int>(coord.size()) == m.ndim())
      << "coordinate " << to_string_list(coord) << " does not fit mesh " << to_string_list(m.dims());
  std::vector<int64_t> s = shape_;
  for (int i = 0; i < m.ndim(); ++i) {
    HP_CHECK(coord[i] >= 0 && coord[i] < m.dim_size(i))
        << "coordinate " << to_string_list(coord) << " is outside mesh " << to_string_list(m.dims());
    if (placements_[i].is_shard()) {
      int t = placements_[i].dim();
      s[t] = chunk_range(s[t], m.dim_size(i), coord[i]).size;
    }
  }
  return s;
}

std::vector<int64_t> ShardSpec::global_offset(const std::vector<int64_t>& coord) const {
  const MeshShape& m = mesh();
  HP_CHECK(static_cast<int>(coord.size()) == m.ndim())
      << "coordinate " << to_string_list(coord) << " does not fit mesh " << to_string_list(m.dims());
  std::vector<int64_t> s = shape_;
  std::vector<int64_t> off(shape_.size(), 0);
  for (int i = 0; i < m.ndim(); ++i) {
    HP_CHECK(coord[i] >= 0 && coord[i] < m.dim_size(i))
        << "coordinate " << to_string_list(coord) << " is outside mesh " << to_string_list(m.dims());
    if (placements_[i].is_shard()) {
      int t = placements_[i].dim();
      ChunkRange r = chunk_range(s[t], m.dim_size(i), coord[i]);
      off[t] += r.offset;
      s[t] = r.size;
    }
  }
  return off;
}

int64_t ShardSpec::local_numel(const std::vector<int64_t>& coord) const {
  int64_t n = 1;
  for (int64_t d : local_shape(coord)) n *= d;
  return n;
}

std::vector<int64_t> ShardSpec::local_shape_of_rank(int rank) const {
  return local_shape(mesh().coord_of(rank));
}
std::vector<int64_t> ShardSpec::global_offset_of_rank(int rank) const {
  return global_offset(mesh().coord_of(rank));
}
int64_t ShardSpec::local_bytes_of_rank(int rank) const { return local_bytes(mesh().coord_of(rank)); }

std::vector<int64_t> ShardSpec::max_local_shape() const {
  return local_shape(std::vector<int64_t>(placements_.size(), 0));
}

int64_t ShardSpec::max_local_bytes() const {
  int64_t n = elem_size_;
  for (int64_t d : max_local_shape()) n *= d;
  return n;
}

ShardSpec ShardSpec::with_placements(std::vector<Placement> placements) const {
  return ShardSpec(shape_, elem_size_, mesh_, std::move(placements));
}

bool ShardSpec::operator==(const ShardSpec& o) const {
  return hash_ == o.hash_ && shape_ == o.shape_ && elem_size_ == o.elem_size_ &&
         placements_ == o.placements_ && (mesh_ == o.mesh_ || mesh_->mesh == o.mesh_->mesh);
}

std::string ShardSpec::to_string() const {
  std::ostringstream os;
  const MeshShape& m = mesh();
  os << to_string_list(shape_) << " x" << elem_size_ << "B on (";
  for (int i = 0; i < m.ndim(); ++i) os << (i ? ", " : "") << m.names()[i] << "=" << m.dim_size(i);
  os << "): " << placements_string(placements_);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const ShardSpec& s) { return os << s.to_string(); }

}  // namespace hp
