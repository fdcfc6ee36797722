#include "hp/layout/redistribute_step.h"

#include <sstream>

namespace hp {

const char* to_string(StepKind k) {
  switch (k) {
    case StepKind::AllGather: return "all_gather";
    case StepKind::ReduceScatter: return "reduce_scatter";
    case StepKind::AllReduce: return "all_reduce";
    case StepKind::AllToAll: return "all_to_all";
    case StepKind::LocalChunk: return "local_chunk";
    case StepKind::LocalReduceToPartial: return "local_reduce_to_partial";
    case StepKind::LocalScale: return "local_scale";
    case StepKind::FlattenedAllToAll: return "flattened_all_to_all";
  }
  return "?";
}

bool is_collective(StepKind k) {
  return k == StepKind::AllGather || k == StepKind::ReduceScatter || k == StepKind::AllReduce ||
         k == StepKind::AllToAll || k == StepKind::FlattenedAllToAll;
}

std::string RedistributeStep::to_string() const {
  std::ostringstream os;
  if (kind == StepKind::FlattenedAllToAll) {
    os << hp::to_string(kind) << "(mesh ";
    for (size_t i = 0; i < mesh_dims.size(); ++i) os << (i ? "+" : "") << mesh_dims[i];
    os << " -> ";
    for (size_t i = 0; i < mesh_dims.size(); ++i) os << (i ? ", " : "") << to.placement(mesh_dims[i]);
    bool partial = false;
    for (int m : mesh_dims) partial = partial || from.placement(m).is_partial();
    if (partial) os << ", reduce " << hp::to_string(op);
    if (scale != 1) os << " x" << scale;
    os << ")";
    return os.str();
  }
  os << hp::to_string(kind) << "(mesh " << mesh_dim;
  if (split_dim >= 0) os << ", split " << split_dim;
  if (concat_dim >= 0) os << ", concat " << concat_dim;
  if (kind == StepKind::AllReduce || kind == StepKind::ReduceScatter ||
      kind == StepKind::LocalReduceToPartial)
    os << ", " << hp::to_string(op);
  if (kind == StepKind::LocalScale) os << ", x" << scale << " -> " << hp::to_string(op);
  os << ")";
  return os.str();
}

namespace {

double product(const std::vector<int64_t>& s, int64_t elem) {
  double n = static_cast<double>(elem);
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

}  // namespace

std::optional<RedistributeStep> single_step(const ShardSpec& from, int mesh_dim,
                                            const Placement& target, const MeshCost& cost) {
  const Placement& cur = from.placement(mesh_dim);
  if (cur == target) return std::nullopt;
  const std::vector<Placement>& ps = from.placements();
  const int n = static_cast<int>(ps.size());
  // No mesh dim after this one shards `t`: then this one may stop sharding `t` (it is the
  // innermost), or start to (its split falls inside every existing one).
  auto innermost = [&](int t) {
    for (int i = mesh_dim + 1; i < n; ++i)
      if (ps[i].is_shard(t)) return false;
    return true;
  };
  auto& can_add = innermost;

  auto linear = [](ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Avg; };
  // Reject before building anything: the planner asks this for every candidate.
  // Shard -> Partial needs a gather first; of Partial -> Partial, only sum <-> avg is a
  // local rescaling.
  const bool ok = cur.is_shard()       ? innermost(cur.dim()) && !target.is_partial() &&
                                             (!target.is_shard() || can_add(target.dim()))
                  : target.is_shard()   ? can_add(target.dim())
                  : target.is_partial() && cur.is_partial() ? linear(cur.op()) && linear(target.op())
                                                            : true;
  if (!ok) return std::nullopt;
  std::vector<Placement> next = ps;
  next[mesh_dim] = target;
  if (!partial_ops_compatible(next)) return std::nullopt;

  const double k = static_cast<double>(from.mesh().dim_size(mesh_dim));
  ShardSpec to = from.with_placements(std::move(next));
  auto step = [&](StepKind kind) {
    return RedistributeStep{kind, mesh_dim, -1, -1, ReduceOp::Sum, 1.0, from, to, cost.zero()};
  };

  if (cur.is_shard()) {
    const int t = cur.dim();
    if (target.is_replicate()) {
      RedistributeStep s = step(StepKind::AllGather);
      s.concat_dim = t;
      s.cost = cost.cost(Collective::AllGather, k * from.max_local_bytes(), mesh_dim);
      return s;
    }
    const int u = target.dim();
    RedistributeStep s = step(StepKind::AllToAll);
    s.split_dim = u;
    s.concat_dim = t;
    std::vector<int64_t> piece = from.max_local_shape();
    piece[u] = to.max_local_shape()[u];
    s.cost = cost.cost(Collective::AllToAll, k * product(piece, from.elem_size()), mesh_dim);
    return s;
  }

  if (cur.is_replicate()) {
    if (target.is_shard()) {
      RedistributeStep s = step(StepKind::LocalChunk);
      s.split_dim = target.dim();
      return s;
    }
    RedistributeStep s = step(StepKind::LocalReduceToPartial);
    s.op = target.op();
    return s;
  }

  // cur is Partial
  const ReduceOp op = cur.op();
  if (target.is_replicate()) {
    RedistributeStep s = step(StepKind::AllReduce);
    s.op = op;
    s.cost = cost.cost(Collective::AllReduce, static_cast<double>(from.max_local_bytes()), mesh_dim);
    return s;
  }
  if (target.is_shard()) {
    RedistributeStep s = step(StepKind::ReduceScatter);
    s.op = op;
    s.split_dim = target.dim();
    s.cost = cost.cost(Collective::ReduceScatter, k * to.max_local_bytes(), mesh_dim);
    return s;
  }
  RedistributeStep s = step(StepKind::LocalScale);  // sum <-> avg, checked above
  s.op = target.op();
  s.scale = op == ReduceOp::Sum ? k : 1.0 / k;  // sum_i x_i == avg_i (k x_i)
  return s;
}

}  // namespace hp
