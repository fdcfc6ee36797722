#include "hp/plan/rank_groups.h"

#include <algorithm>

#include "hp/base/error.h"

namespace hp::plan {

const char* to_string(GroupKind g) {
  switch (g) {
    case GroupKind::TP: return "tp";
    case GroupKind::CP: return "cp";
    case GroupKind::EP: return "ep";
    case GroupKind::DP: return "dp";
    case GroupKind::PP: return "pp";
    case GroupKind::DenseGrad: return "dp*ep*cp";
    case GroupKind::ExpertGrad: return "dp*cp";
    case GroupKind::CpRing: return "cp_ring";
    case GroupKind::CpUlysses: return "cp_ulysses";
  }
  return "?";
}

const CollectiveCost& CostCache::cost(Collective kind, double bytes, const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t(kind) * 0x9E3779B97F4A7C15ull) ^ std::hash<double>()(bytes);
  for (int r : ranks) h = (h ^ uint64_t(r)) * 1099511628211ull;
  auto range = entries_.equal_range(h);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second.kind == kind && it->second.bytes == bytes && it->second.ranks == ranks) return it->second.cost;
  Entry e{kind, bytes, ranks, topo_.cost(kind, bytes, ranks)};
  return entries_.emplace(h, std::move(e))->second.cost;
}

namespace {
constexpr int kPP = 0, kDP = 1, kEP = 2, kRing = 3, kUlysses = 4, kTP = 5;
constexpr int kKinds = 9;
}  // namespace

RankGroups::RankGroups(CostCache& cache, const Strategy& s)
    : cache_(cache),
      mesh_({s.pp, s.dp, s.ep, s.cp / s.cp_ulysses, s.cp_ulysses, s.tp}, {"pp", "dp", "ep", "cp_ring", "cp_ulysses", "tp"}),
      samples_(kKinds) {
  HP_CHECK(mesh_.size() <= cache.topology().num_devices())
      << "strategy needs " << mesh_.size() << " devices, the topology has " << cache.topology().num_devices();
  const std::vector<std::vector<int>> dims = {
      {kTP}, {kRing, kUlysses}, {kEP}, {kDP}, {kPP}, {kDP, kEP, kRing, kUlysses}, {kDP, kRing, kUlysses}, {kRing},
      {kUlysses}};
  const int n = static_cast<int>(mesh_.size());
  const std::vector<int> probes = {0, n / 3, (2 * n) / 3, n - 1};
  for (int k = 0; k < kKinds; ++k) {
    auto& out = samples_[k];
    for (int r : probes) {
      auto g = mesh_.group_along(r, dims[k]);
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(std::move(g));
    }
  }
}

int64_t RankGroups::size(GroupKind g) const { return static_cast<int64_t>(samples_[int(g)][0].size()); }

const std::vector<std::vector<int>>& RankGroups::samples(GroupKind g) const { return samples_[int(g)]; }

const CollectiveCost& RankGroups::cost(GroupKind g, Collective kind, double bytes) {
  auto key = std::make_tuple(int(g), int(kind), bytes);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  CollectiveCost worst;
  worst.bytes_per_level.assign(cache_.topology().levels().size(), 0.0);
  bool first = true;
  for (const auto& group : samples_[int(g)]) {
    if (kind == Collective::SendRecv) {
      for (size_t i = 0; i + 1 < group.size(); ++i) {
        const CollectiveCost& c = cache_.cost(kind, bytes, {group[i], group[i + 1]});
        if (first || c.seconds > worst.seconds) worst = c, first = false;
      }
    } else {
      const CollectiveCost& c = cache_.cost(kind, bytes, group);
      if (first || c.seconds > worst.seconds) worst = c, first = false;
    }
  }
  return memo_.emplace(key, worst).first->second;
}

}  // namespace hp::plan
