#include "hp/layout/sharding_propagation.h"

#include <mutex>
#include <shared_mutex>
#include <tuple>
#include <unordered_map>

#include "hp/base/error.h"

namespace hp {
namespace {

// A view keeps a shard of a merged or split segment only when each piece is whole rows on
// both sides: the ranks that shard the dim (all mesh dims sharding it) divide both extents.
// signatures() knows only the whole mesh; testing against it refused, e.g., a batch of 4
// rows over dp=4 on a dp x tp mesh, and the planner moved the batch shard onto the
// vocabulary instead (empty vocabulary pieces on large meshes).
bool view_pieces_whole(const MeshShape& mesh, const std::vector<int64_t>& in_shape,
                       const std::vector<int64_t>& out_shape, const std::vector<Placement>& in_ps,
                       const std::vector<Placement>& out_ps) {
  for (int d = 0; d < static_cast<int>(in_shape.size()); ++d) {
    int64_t ranks = 1;
    int e = -1;
    for (int m = 0; m < mesh.ndim(); ++m)
      if (in_ps[m].is_shard(d) && out_ps[m].is_shard()) {
        ranks *= mesh.dim_size(m);
        e = out_ps[m].dim();
      }
    if (ranks == 1 || in_shape[d] == out_shape[e]) continue;
    if (in_shape[d] % ranks != 0 || out_shape[e] % ranks != 0) return false;
  }
  return true;
}

std::shared_ptr<const ShardingDecision> decide(const Op& op, const std::vector<ShardSpec>& inputs) {
  HP_CHECK(static_cast<int>(inputs.size()) == op.arity())
      << op.to_string() << " takes " << op.arity() << " inputs, found " << inputs.size();
  const MeshShape& mesh = inputs[0].mesh();
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& s : inputs) {
    HP_CHECK(s.mesh() == mesh) << op.to_string() << ": inputs on different meshes, "
                               << mesh.to_string() << " and " << s.mesh().to_string();
    shapes.push_back(s.shape());
  }
  const std::vector<int64_t> out_shape = output_shape(op, shapes);
  // Views are checked below against the ranks that actually shard each dim.
  const bool is_view = op.kind == OpKind::View;
  const std::vector<Signature> sigs = signatures(op, shapes, is_view ? 1 : mesh.size());
  const int nd = mesh.ndim();

  // Every choice of one signature per mesh dim (odometer order: earlier signatures first).
  std::shared_ptr<ShardingDecision> best;
  std::tuple<double, size_t> best_key{0, 0};
  std::vector<size_t> pick(nd, 0);
  while (true) {
    std::vector<std::vector<Placement>> in_ps(inputs.size(), std::vector<Placement>(nd));
    std::vector<Placement> out_ps(nd);
    for (int m = 0; m < nd; ++m) {
      const Signature& s = sigs[pick[m]];
      for (size_t i = 0; i < inputs.size(); ++i) in_ps[i][m] = s.inputs[i];
      out_ps[m] = s.output;
    }
    bool valid = partial_ops_compatible(out_ps);
    for (const auto& ps : in_ps) valid = valid && partial_ops_compatible(ps);
    if (valid && is_view) valid = view_pieces_whole(mesh, shapes[0], out_shape, in_ps[0], out_ps);
    if (valid) {
      auto d = std::make_shared<ShardingDecision>(ShardingDecision{
          {}, {}, ShardSpec(out_shape, inputs[0].elem_size(), mesh, out_ps), {}});
      size_t steps = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        d->inputs.push_back(inputs[i].with_placements(in_ps[i]));
        auto plan = plan_redistribute(inputs[i], d->inputs.back());
        if (i == 0) d->cost = plan->cost;
        else d->cost += plan->cost;
        steps += plan->steps.size();
      }
      std::tuple<double, size_t> key{d->cost.seconds, steps};  // then the earlier choice
      if (!best || key < best_key) {
        for (int m = 0; m < nd; ++m) d->per_mesh_dim.push_back(sigs[pick[m]]);
        best = std::move(d);
        best_key = key;
      }
    }
    int m = nd - 1;
    for (; m >= 0; --m) {
      if (++pick[m] < sigs.size()) break;
      pick[m] = 0;
    }
    if (m < 0) break;
  }
  HP_CHECK(best) << op.to_string() << ": no signature fits inputs " << inputs[0];
  return best;
}

struct Key {
  Op op;
  std::vector<ShardSpec> inputs;
  bool operator==(const Key& o) const { return op == o.op && inputs == o.inputs; }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = k.op.hash();
    for (const auto& s : k.inputs) h = h * 31 + s.hash();
    return h;
  }
};
struct Cache {
  std::shared_mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const ShardingDecision>, KeyHash> decisions;
};
Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

std::shared_ptr<const ShardingDecision> propagate(const Op& op, const std::vector<ShardSpec>& inputs) {
  Key key{op, inputs};
  Cache& c = cache();
  {
    std::shared_lock<std::shared_mutex> lock(c.mutex);
    auto it = c.decisions.find(key);
    if (it != c.decisions.end()) return it->second;
  }
  auto d = decide(op, inputs);
  std::unique_lock<std::shared_mutex> lock(c.mutex);
  return c.decisions.emplace(std::move(key), std::move(d)).first->second;
}

size_t propagation_cache_size() {
  std::shared_lock<std::shared_mutex> lock(cache().mutex);
  return cache().decisions.size();
}

void clear_propagation_cache() {
  std::unique_lock<std::shared_mutex> lock(cache().mutex);
  cache().decisions.clear();
}

}  // namespace hp
