#include "hp/layout/redistribute_plan.h"

#include <algorithm>
#include <optional>
#include <queue>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

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

// Every set of two or more mesh dims small enough to flatten, each increasing.
std::vector<std::vector<int>> flattenable_groups(const MeshShape& mesh) {
  std::vector<std::vector<int>> out;
  for (uint32_t mask = 0; mask < (1u << mesh.ndim()); ++mask) {
    std::vector<int> dims;
    int64_t members = 1;
    for (int m = 0; m < mesh.ndim(); ++m)
      if (mask >> m & 1) {
        dims.push_back(m);
        members *= mesh.dim_size(m);
      }
    // A size-1 dim adds nothing to a flattened group: the group without it moves the same data.
    bool trivial = false;
    for (int m : dims) trivial = trivial || mesh.dim_size(m) == 1;
    if (dims.size() >= 2 && members <= kMaxFlattenedMembers && !trivial) out.push_back(std::move(dims));
  }
  return out;
}

// Dijkstra over layouts from `from`, each step priced by `cost`, until every target is
// settled: the least-cost path to each, then.
class LayoutSearch {
 public:
  LayoutSearch(const ShardSpec& from, const std::vector<ShardSpec>& targets, const MeshCost& cost,
               StepSet step_set)
      : cost_(cost), states_{from}, index_{{from, 0}}, dist_{Dist{}}, step_into_{std::nullopt}, prev_{-1},
        done_{false} {
    // Candidate placements of any mesh dim: intermediate partials only of ops already in play.
    candidates_.push_back(Replicate());
    for (int t = 0; t < from.ndim(); ++t) candidates_.push_back(Shard(t));
    std::vector<const ShardSpec*> in_play{&from};
    for (const auto& t : targets) in_play.push_back(&t);
    for (const ShardSpec* s : in_play)
      for (const auto& p : s->placements())
        if (p.is_partial() && std::find(candidates_.begin(), candidates_.end(), p) == candidates_.end())
          candidates_.push_back(p);
    if (step_set == StepSet::All) groups_ = flattenable_groups(from.mesh());
    // A size-1 mesh dim moves no data whatever its placement, but each placement it could
    // take multiplies the states to search: it only steps to Replicate (which unblocks the
    // dims around it) or to what a target wants there.
    const int n = from.mesh().ndim();
    trivial_candidates_.resize(n);
    for (int m = 0; m < n; ++m) {
      if (from.mesh().dim_size(m) != 1) continue;
      auto& c = trivial_candidates_[m];
      c.push_back(Replicate());
      for (const auto& t : targets)
        if (std::find(c.begin(), c.end(), t.placement(m)) == c.end()) c.push_back(t.placement(m));
    }
    run(targets);
  }

  RedistributePlan plan_to(const ShardSpec& to) const {
    RedistributePlan plan{{}, cost_.zero()};
    auto it = index_.find(to);
    HP_CHECK(it != index_.end() && done_[it->second])
        << "no redistribution found from " << states_[0] << " to " << to;
    for (int v = it->second; prev_[v] >= 0; v = prev_[v]) plan.steps.push_back(*step_into_[v]);
    std::reverse(plan.steps.begin(), plan.steps.end());
    for (const auto& s : plan.steps) plan.cost += s.cost;
    return plan;
  }

 private:
  void run(const std::vector<ShardSpec>& targets) {
    std::unordered_set<ShardSpec> open(targets.begin(), targets.end());
    using Item = std::pair<Dist, int>;
    auto greater = [](const Item& a, const Item& b) { return a.first > b.first; };
    std::priority_queue<Item, std::vector<Item>, decltype(greater)> queue(greater);
    queue.push({Dist{}, 0});
    auto wanted = [&](const ShardSpec& s) {  // not settled yet: worth pricing a step to it
      auto it = index_.find(s);
      return it == index_.end() || !done_[it->second];
    };
    while (!queue.empty() && !open.empty()) {
      auto [d, u] = queue.top();
      queue.pop();
      if (done_[u]) continue;
      done_[u] = true;
      open.erase(states_[u]);
      if (open.empty()) return;
      const ShardSpec cur = states_[u];
      for (int m = 0; m < cur.mesh().ndim(); ++m)
        for (const auto& p : cur.mesh().dim_size(m) == 1 ? trivial_candidates_[m] : candidates_)
          if (auto s = single_step(cur, m, p, cost_)) relax(u, d, std::move(*s), queue);
      for (const auto& g : groups_)
        for (auto& s : flattened_steps(cur, g, cost_, wanted)) relax(u, d, std::move(s), queue);
    }
  }

  template <typename Queue>
  void relax(int u, const Dist& d, RedistributeStep&& s, Queue& queue) {
    Dist nd = add(d, s);
    auto [it, fresh] = index_.emplace(s.to, static_cast<int>(states_.size()));
    const int v = it->second;
    if (fresh) {
      states_.push_back(s.to);
      dist_.push_back(nd);
      step_into_.push_back(std::move(s));
      prev_.push_back(u);
      done_.push_back(false);
    } else if (!done_[v] && nd < dist_[v]) {
      dist_[v] = nd;
      step_into_[v] = std::move(s);
      prev_[v] = u;
    } else {
      return;
    }
    queue.push({nd, v});
  }

  const MeshCost& cost_;
  std::vector<Placement> candidates_;
  std::vector<std::vector<Placement>> trivial_candidates_;  // per mesh dim of size 1
  std::vector<std::vector<int>> groups_;
  std::vector<ShardSpec> states_;
  std::unordered_map<ShardSpec, int> index_;
  std::vector<Dist> dist_;
  std::vector<std::optional<RedistributeStep>> step_into_;  // the best step into each state
  std::vector<int> prev_;
  std::vector<bool> done_;
};

}  // namespace

std::string RedistributePlan::to_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < steps.size(); ++i) os << (i ? "; " : "") << steps[i].to_string();
  if (steps.empty()) os << "(nothing)";
  os << " [" << cost.seconds * 1e6 << " us, " << cost.total_bytes() << " B]";
  return os.str();
}

RedistributePlan min_cost_plan(const ShardSpec& from, const ShardSpec& to,
                               const ClusterTopology& topology, StepSet step_set) {
  return min_cost_plans(from, {to}, topology, step_set)[0];
}

std::vector<RedistributePlan> min_cost_plans(const ShardSpec& from, const std::vector<ShardSpec>& targets,
                                             const ClusterTopology& topology, StepSet step_set) {
  for (const auto& to : targets) check_compatible(from, to);
  MeshCost cost(from.mesh(), topology);
  LayoutSearch search(from, targets, cost, step_set);
  std::vector<RedistributePlan> plans;
  for (const auto& to : targets) plans.push_back(search.plan_to(to));
  return plans;
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
