// flattened_step: one all-to-all over a group of several mesh dims at once.
#include <algorithm>
#include <utility>

#include "hp/layout/redistribute_step.h"

namespace hp {
namespace {

// Along tensor dim `t`, a group's members vary only on the group's mesh dims, so the union
// of their pieces is fixed by the mesh dims sharding `t` up to the last one outside the
// group, of which the group's own count only by their sizes: the group's part of the
// tensor stays put when that prefix reads the same after. (Off the group the placements
// are the same before and after, so that last one is too.)
bool keeps_group_region(const MeshShape& mesh, const std::vector<Placement>& from, const std::vector<Placement>& to,
                        const std::vector<bool>& in_group, int ndim) {
  const int n = mesh.ndim();
  for (int t = 0; t < ndim; ++t) {
    int last = -1;
    for (int m = 0; m < n; ++m)
      if (!in_group[m] && from[m].is_shard(t)) last = m;
    // Walk the mesh dims sharding `t` before `last` in both, side by side.
    int a = 0, b = 0;
    while (true) {
      while (a < last && !from[a].is_shard(t)) ++a;
      while (b < last && !to[b].is_shard(t)) ++b;
      if (a >= last || b >= last) {
        if (a < last || b < last) return false;
        break;
      }
      if (in_group[a] != in_group[b]) return false;
      if (in_group[a] ? mesh.dim_size(a) != mesh.dim_size(b) : a != b) return false;
      ++a;
      ++b;
    }
  }
  return true;
}

// Each member's piece as [begin, end) per tensor dim, back to back: pricing meets every
// pair of members, so it reads flat arrays.
std::vector<int64_t> extents(const ShardSpec& spec, const std::vector<std::vector<int64_t>>& group) {
  const int nd = spec.ndim();
  std::vector<int64_t> out(group.size() * nd * 2);
  for (size_t i = 0; i < group.size(); ++i) {
    int64_t* e = &out[i * nd * 2];
    for (int t = 0; t < nd; ++t) {
      e[2 * t] = 0;
      e[2 * t + 1] = spec.shape()[t];
    }
    for (int m = 0; m < spec.mesh().ndim(); ++m) {
      const Placement& p = spec.placement(m);
      if (!p.is_shard()) continue;
      int64_t* x = e + 2 * p.dim();
      const ChunkRange r = chunk_range(x[1] - x[0], spec.mesh().dim_size(m), group[i][m]);
      x[0] += r.offset;
      x[1] = x[0] + r.size;
    }
  }
  return out;
}

int64_t overlap(const int64_t* a, const int64_t* b, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < 2 * ndim; d += 2) {
    const int64_t len = std::min(a[d + 1], b[d + 1]) - std::max(a[d], b[d]);
    if (len <= 0) return 0;
    n *= len;
  }
  return n;
}

// What every step out of one layout over one group shares: the group at coordinate 0 off
// its dims (row-major over them), who takes from whom, and the pieces held now.
class Source {
 public:
  Source(const ShardSpec& from, const std::vector<int>& dims) : from_(from), dims_(dims) {
    const MeshShape& mesh = from.mesh();
    in_group_.assign(mesh.ndim(), false);
    members_ = 1;
    for (int m : dims) {
      in_group_[m] = true;
      members_ *= mesh.dim_size(m);
    }
    group_.assign(1, std::vector<int64_t>(mesh.ndim(), 0));
    for (int d : dims) {
      std::vector<std::vector<int64_t>> next;
      for (const auto& c : group_)
        for (int64_t i = 0; i < mesh.dim_size(d); ++i) {
          next.push_back(c);
          next.back()[d] = i;
        }
      group_ = std::move(next);
    }
    // A member takes from those that share its coordinates where `from` replicates.
    replica_.assign(group_.size(), 0);
    for (size_t i = 0; i < group_.size(); ++i)
      for (int m : dims)
        if (from.placement(m).is_replicate()) replica_[i] = replica_[i] * mesh.dim_size(m) + group_[i][m];
    sent_ = extents(from, group_);
    for (int m : dims) {
      const Placement& p = from.placement(m);
      if (!p.is_partial()) continue;
      if (p.op() == ReduceOp::Avg) scale_ /= static_cast<double>(mesh.dim_size(m));
      if (p.op() == ReduceOp::Max || p.op() == ReduceOp::Min) op_ = p.op();
    }
  }

  int64_t members() const { return members_; }

  // Whether a step to `placements` (the same as now off the group's dims) can be one.
  bool can_reach(const std::vector<Placement>& placements) const {
    for (int m : dims_)
      if (placements[m].is_partial()) return false;
    return keeps_group_region(from_.mesh(), from_.placements(), placements, in_group_, from_.ndim());
  }

  // The step to `to`, which can_reach.
  RedistributeStep step_to(const ShardSpec& to, const MeshCost& cost) const {
    const std::vector<int64_t> held = extents(to, group_);
    const int nd = from_.ndim();
    std::vector<Transfer> transfers;
    transfers.reserve(group_.size() * group_.size());
    for (size_t i = 0; i < group_.size(); ++i)
      for (size_t j = 0; j < group_.size(); ++j) {
        if (i == j || replica_[i] != replica_[j]) continue;
        const int64_t n = overlap(&sent_[i * 2 * nd], &held[j * 2 * nd], nd);
        if (n > 0)
          transfers.push_back({static_cast<int>(i), static_cast<int>(j), static_cast<double>(n * from_.elem_size())});
      }
    return RedistributeStep{StepKind::FlattenedAllToAll, dims_[0], -1, -1, op_, scale_, from_, to,
                            cost.exchange(transfers, dims_), dims_};
  }

 private:
  const ShardSpec& from_;
  const std::vector<int>& dims_;
  std::vector<bool> in_group_;
  int64_t members_;
  std::vector<std::vector<int64_t>> group_;
  std::vector<int64_t> replica_;
  std::vector<int64_t> sent_;
  ReduceOp op_ = ReduceOp::Sum;  // how the partial terms on the group's dims combine
  double scale_ = 1.0;
};

bool valid_dims(const MeshShape& mesh, const std::vector<int>& dims) {
  if (dims.size() < 2) return false;
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] < 0 || dims[i] >= mesh.ndim() || (i && dims[i] <= dims[i - 1])) return false;
  return true;
}

}  // namespace

std::optional<RedistributeStep> flattened_step(const ShardSpec& from, const ShardSpec& to,
                                               const std::vector<int>& mesh_dims, const MeshCost& cost) {
  const MeshShape& mesh = from.mesh();
  if (!valid_dims(mesh, mesh_dims) || from == to || to.mesh() != mesh || to.shape() != from.shape() ||
      to.elem_size() != from.elem_size())
    return std::nullopt;
  for (int m = 0; m < mesh.ndim(); ++m)
    if (std::find(mesh_dims.begin(), mesh_dims.end(), m) == mesh_dims.end() && from.placement(m) != to.placement(m))
      return std::nullopt;
  Source source(from, mesh_dims);
  if (source.members() > kMaxFlattenedMembers || !source.can_reach(to.placements())) return std::nullopt;
  return source.step_to(to, cost);
}

std::vector<RedistributeStep> flattened_steps(const ShardSpec& from, const std::vector<int>& mesh_dims,
                                              const MeshCost& cost,
                                              const std::function<bool(const ShardSpec&)>& wanted) {
  std::vector<RedistributeStep> out;
  if (!valid_dims(from.mesh(), mesh_dims)) return out;
  Source source(from, mesh_dims);
  if (source.members() > kMaxFlattenedMembers) return out;
  const int options = from.ndim() + 1;  // Replicate, Shard(0), ..., Shard(ndim - 1)
  std::vector<int> pick(mesh_dims.size(), 0);
  while (true) {
    std::vector<Placement> next = from.placements();
    for (size_t i = 0; i < mesh_dims.size(); ++i) next[mesh_dims[i]] = pick[i] ? Shard(pick[i] - 1) : Replicate();
    if (next != from.placements() && source.can_reach(next)) {
      ShardSpec to = from.with_placements(std::move(next));
      if (wanted(to)) out.push_back(source.step_to(to, cost));
    }
    size_t i = 0;
    for (; i < mesh_dims.size() && ++pick[i] == options; ++i) pick[i] = 0;
    if (i == mesh_dims.size()) return out;
  }
}

}  // namespace hp
