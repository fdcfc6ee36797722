#include "hp/layout/redistribute_plan.h"

#include <algorithm>
#include <queue>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "hp/base/error.h"

namespace hp {
namespace {

void check_compatible(const ShardSpec& from, const ShardSpec& to) {
  HP_CHECK(from.shape() == to.shape() && from.elem_size() == to.elem_size())
      << "redistribute keeps the tensor: from " << from << " to " << to;
  HP_CHECK(from.mesh() == to.mesh())
      << "redistribute keeps the mesh: from " << from.mesh().to_string() << " to "
      << to.mesh().to_string();
}

ClusterTopology default_topology(const ShardSpec& s) { return ClusterTopology::uniform(s.mesh().size()); }

// Lexicographic: time, then bytes, then number of steps.
struct Dist {
  double seconds = 0;
  double bytes = 0;
  int steps = 0;
  bool operator<(const Dist& o) const {
    return std::tie(seconds, bytes, steps) < std::tie(o.seconds, o.bytes, o.steps);
  }
  bool operator>(const Dist& o) const { return o < *this; }
};

Dist add(const Dist& d, const RedistributeStep& s) {
  return {d.seconds + s.cost.seconds, d.bytes + s.cost.total_bytes(), d.steps + 1};
}

}  // namespace

std::string RedistributePlan::to_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < steps.size(); ++i) os << (i ? "; " : "") << steps[i].to_string();
  if (steps.empty()) os << "(nothing)";
  os << " [" << cost.seconds * 1e6 << " us, " << cost.total_bytes() << " B]";
  return os.str();
}

RedistributePlan min_cost_plan(const ShardSpec& from, const ShardSpec& to,
                               const ClusterTopology& topology) {
  check_compatible(from, to);
  MeshCost cost(from.mesh(), topology);
  RedistributePlan plan{{}, cost.zero()};
  if (from == to) return plan;

  // Candidate placements of any mesh dim: intermediate partials only of ops already in play.
  std::vector<Placement> candidates{Replicate()};
  for (int t = 0; t < from.ndim(); ++t) candidates.push_back(Shard(t));
  for (const ShardSpec* s : {&from, &to})
    for (const auto& p : s->placements())
      if (p.is_partial() && std::find(candidates.begin(), candidates.end(), p) == candidates.end())
        candidates.push_back(p);

  std::vector<ShardSpec> states{from};
  std::unordered_map<ShardSpec, int> index{{from, 0}};
  std::vector<Dist> dist{Dist{}};
  std::vector<std::pair<int, Placement>> via{{-1, Placement()}};  // step into each state
  std::vector<int> prev{-1};
  std::vector<bool> done{false};
  using Item = std::pair<Dist, int>;
  auto greater = [](const Item& a, const Item& b) { return a.first > b.first; };
  std::priority_queue<Item, std::vector<Item>, decltype(greater)> queue(greater);
  queue.push({Dist{}, 0});
  int goal = -1;
  while (!queue.empty()) {
    auto [d, u] = queue.top();
    queue.pop();
    if (done[u]) continue;
    done[u] = true;
    if (states[u] == to) {
      goal = u;
      break;
    }
    for (int m = 0; m < from.mesh().ndim(); ++m) {
      for (const auto& p : candidates) {
        std::optional<RedistributeStep> s = single_step(states[u], m, p, cost);
        if (!s) continue;
        Dist nd = add(d, *s);
        auto [it, fresh] = index.emplace(s->to, static_cast<int>(states.size()));
        int v = it->second;
        if (fresh) {
          states.push_back(s->to);
          dist.push_back(nd);
          via.push_back({m, p});
          prev.push_back(u);
          done.push_back(false);
        } else if (!done[v] && nd < dist[v]) {
          dist[v] = nd;
          via[v] = {m, p};
          prev[v] = u;
        } else {
          continue;
        }
        queue.push({nd, v});
      }
    }
  }
  HP_CHECK(goal >= 0) << "no redistribution found from " << from << " to " << to;
  for (int v = goal; prev[v] >= 0; v = prev[v])
    plan.steps.push_back(*single_step(states[prev[v]], via[v].first, via[v].second, cost));
  std::reverse(plan.steps.begin(), plan.steps.end());
  for (const auto& s : plan.steps) plan.cost += s.cost;
  return plan;
}

RedistributePlan min_cost_plan(const ShardSpec& from, const ShardSpec& to) {
  return min_cost_plan(from, to, default_topology(from));
}

RedistributePlan per_mesh_dim_plan(const ShardSpec& from, const ShardSpec& to,
                                   const ClusterTopology& topology) {
  check_compatible(from, to);
  MeshCost cost(from.mesh(), topology);
  RedistributePlan plan{{}, cost.zero()};
  ShardSpec cur = from;
  const std::vector<Placement>& target = to.placements();
  const int n = from.mesh().ndim();

  auto push = [&](std::optional<RedistributeStep> s, int m, const Placement& p) {
    HP_CHECK(s) << "per-mesh-dim plan cannot turn mesh dim " << m << " of " << cur << " into " << p;
    plan.steps.push_back(*s);
    cur = s->to;
  };
  // One transition on a mesh dim; through Replicate where no single step does it.
  auto apply = [&](int m, const Placement& p) {
    if (cur.placement(m) == p) return;
    std::optional<RedistributeStep> s = single_step(cur, m, p, cost);
    if (!s && p.is_partial()) {
      // Partials of an op that cannot mix with p's are reduced first.
      for (int i = 0; i < n; ++i)
        if (i != m && cur.placement(i).is_partial() &&
            !partial_ops_compatible({cur.placement(i), p}))
          push(single_step(cur, i, Replicate(), cost), i, Replicate());
      s = single_step(cur, m, p, cost);
    }
    if (!s && !cur.placement(m).is_replicate()) {
      push(single_step(cur, m, Replicate(), cost), m, Replicate());
      s = single_step(cur, m, p, cost);
    }
    push(std::move(s), m, p);
  };

  // PyTorch skips this pass when the shards multiply to 1; here size-1 mesh dims still
  // fix the order in which a tensor dim is split, so any Shard triggers it.
  bool sharded = false;
  for (int m = 0; m < n; ++m) sharded = sharded || from.placement(m).is_shard();
  if (n > 1 && sharded) {
    for (int m = n - 1; m >= 0; --m) {
      Placement p = target[m];
      if (p.is_shard()) {
        // Outer mesh dims must shard this tensor dim alike, or this one replicates first.
        const int t = p.dim();
        for (int i = 0; i < m; ++i)
          if (cur.placement(i).is_shard(t) != target[i].is_shard(t)) p = Replicate();
      }
      apply(m, p);
    }
  }
  for (int m = 0; m < n; ++m) apply(m, target[m]);
  for (const auto& s : plan.steps) plan.cost += s.cost;
  return plan;
}

RedistributePlan per_mesh_dim_plan(const ShardSpec& from, const ShardSpec& to) {
  return per_mesh_dim_plan(from, to, default_topology(from));
}

}  // namespace hp
