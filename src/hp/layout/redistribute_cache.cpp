// The process-wide cache behind plan_redistribute: planning is a pure function of
// (from, to, topology), so each pair is planned once and then served by a hash lookup.
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "hp/layout/redistribute_plan.h"

namespace hp {
namespace {

struct Key {
  ShardSpec from, to;
  std::vector<LinkLevel> levels;
  bool operator==(const Key& o) const {
    if (from != o.from || to != o.to || levels.size() != o.levels.size()) return false;
    for (size_t i = 0; i < levels.size(); ++i) {
      const LinkLevel &a = levels[i], &b = o.levels[i];
      if (a.name != b.name || a.fanout != b.fanout || a.bandwidth_GBps != b.bandwidth_GBps ||
          a.latency_us != b.latency_us)
        return false;
    }
    return true;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = k.from.hash() * 31 + k.to.hash();
    for (const auto& l : k.levels)
      h = h * 1000003u ^ (std::hash<int64_t>()(l.fanout) + std::hash<double>()(l.bandwidth_GBps) * 7 +
                          std::hash<double>()(l.latency_us) * 13);
    return h;
  }
};

struct Cache {
  std::shared_mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const RedistributePlan>, KeyHash> plans;
};

Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

std::shared_ptr<const RedistributePlan> plan_redistribute(const ShardSpec& from, const ShardSpec& to,
                                                          const ClusterTopology& topology) {
  Key key{from, to, topology.levels()};
  Cache& c = cache();
  {
    std::shared_lock<std::shared_mutex> lock(c.mutex);
    auto it = c.plans.find(key);
    if (it != c.plans.end()) return it->second;
  }
  // Planned outside the lock; a racing thread's identical plan is simply dropped.
  auto plan = std::make_shared<const RedistributePlan>(min_cost_plan(from, to, topology));
  std::unique_lock<std::shared_mutex> lock(c.mutex);
  return c.plans.emplace(std::move(key), std::move(plan)).first->second;
}

std::shared_ptr<const RedistributePlan> plan_redistribute(const ShardSpec& from, const ShardSpec& to) {
  return plan_redistribute(from, to, ClusterTopology::uniform(from.mesh().size()));
}

size_t redistribute_cache_size() {
  std::shared_lock<std::shared_mutex> lock(cache().mutex);
  return cache().plans.size();
}

void clear_redistribute_cache() {
  std::unique_lock<std::shared_mutex> lock(cache().mutex);
  cache().plans.clear();
}

}  // namespace hp
