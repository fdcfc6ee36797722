#include "hp/topology/cluster.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "hp/base/error.h"

namespace hp {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Broadcast: return "broadcast";
    case Collective::SendRecv: return "send_recv";
  }
  return "?";
}

double CollectiveCost::total_bytes() const {
  double s = 0;
  for (double b : bytes_per_level) s += b;
  return s;
}

CollectiveCost& CollectiveCost::operator+=(const CollectiveCost& o) {
  seconds += o.seconds;
  if (bytes_per_level.size() < o.bytes_per_level.size()) bytes_per_level.resize(o.bytes_per_level.size());
  for (size_t i = 0; i < o.bytes_per_level.size(); ++i) bytes_per_level[i] += o.bytes_per_level[i];
  return *this;
}

ClusterTopology::ClusterTopology(std::vector<LinkLevel> levels) : levels_(std::move(levels)) {
  HP_CHECK(!levels_.empty()) << "a topology needs at least one level";
  for (const auto& l : levels_)
    HP_CHECK(l.fanout >= 1 && l.bandwidth_GBps > 0 && l.latency_us >= 0)
        << "level '" << l.name << "' needs fanout >= 1, bandwidth > 0, latency >= 0; got fanout "
        << l.fanout << ", " << l.bandwidth_GBps << " GB/s, " << l.latency_us << " us";
}

ClusterTopology ClusterTopology::uniform(int64_t devices, double bandwidth_GBps, double latency_us) {
  return ClusterTopology({LinkLevel{"flat", devices, bandwidth_GBps, latency_us}});
}

int64_t ClusterTopology::num_devices() const {
  int64_t n = 1;
  for (const auto& l : levels_) n *= l.fanout;
  return n;
}

int ClusterTopology::link_level(int a, int b) const {
  int64_t unit = 1;
  for (size_t l = 0; l < levels_.size(); ++l) {
    unit *= levels_[l].fanout;
    if (a / unit == b / unit) return static_cast<int>(l);
  }
  return static_cast<int>(levels_.size()) - 1;  // beyond the described cluster: the top level
}

CollectiveCost ClusterTopology::cost(Collective kind, double bytes, const std::vector<int>& ranks) const {
  CollectiveCost c;
  c.bytes_per_level.assign(levels_.size(), 0.0);
  const int n = static_cast<int>(ranks.size());
  if (n <= 1 || bytes <= 0) return c;

  auto bw = [&](int lvl) { return levels_[lvl].bandwidth_GBps * 1e9; };
  auto lat = [&](int lvl) { return levels_[lvl].latency_us * 1e-6; };

  if (kind == Collective::AllToAll) {
    // Every rank sends bytes/n to each peer directly; the busiest rank sets the time.
    // Peers are counted per link level (members sharing each level's unit), not visited
    // pair by pair: O(n * levels), which keeps 10^3-rank groups cheap to price.
    const double piece = bytes / n;
    const int levels = static_cast<int>(levels_.size());
    std::vector<std::map<int64_t, int>> members(levels);  // per level: unit -> members in it
    int64_t unit = 1;
    std::vector<int64_t> units(levels);
    for (int l = 0; l < levels; ++l) {
      units[l] = unit *= levels_[l].fanout;
      for (int r : ranks) ++members[l][r / unit];
    }
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      double t = 0;
      int below = 1;  // members met at lower levels, this rank included
      for (int l = 0; l < levels; ++l) {
        // The top level also takes every peer beyond the described cluster.
        const int within = l + 1 < levels ? members[l][ranks[i] / units[l]] : n;
        const int peers = within - below;
        below = within;
        if (peers <= 0) continue;
        c.bytes_per_level[l] += piece * peers;
        t += peers * (piece / bw(l) + lat(l));
      }
      worst = std::max(worst, t);
    }
    c.seconds = worst;
    return c;
  }

  // Ring algorithms: each rank sends `per_rank` bytes to its successor in `steps` steps.
  double per_rank = 0;
  int steps = 0;
  switch (kind) {
    case Collective::AllReduce: per_rank = 2.0 * (n - 1) / n * bytes; steps = 2 * (n - 1); break;
    case Collective::AllGather:
    case Collective::ReduceScatter: per_rank = double(n - 1) / n * bytes; steps = n - 1; break;
    case Collective::Broadcast: per_rank = bytes; steps = static_cast<int>(std::ceil(std::log2(n))); break;
    case Collective::SendRecv: per_rank = bytes; steps = 1; break;
    case Collective::AllToAll: break;
  }
  if (kind == Collective::SendRecv) {
    int lvl = link_level(ranks[0], ranks[1]);
    c.bytes_per_level[lvl] += bytes;
    c.seconds = bytes / bw(lvl) + lat(lvl);
    return c;
  }
  double slowest = 0;
  int top = 0;
  for (int i = 0; i < n; ++i) {
    int lvl = link_level(ranks[i], ranks[(i + 1) % n]);
    c.bytes_per_level[lvl] += per_rank;
    slowest = std::max(slowest, per_rank / bw(lvl));
    top = std::max(top, lvl);
  }
  c.seconds = slowest + steps * lat(top);
  return c;
}

CollectiveCost ClusterTopology::exchange_cost(const std::vector<int>& ranks,
                                              const std::vector<Transfer>& transfers) const {
  CollectiveCost c;
  c.bytes_per_level.assign(levels_.size(), 0.0);
  std::vector<double> sending(ranks.size(), 0.0), receiving(ranks.size(), 0.0);
  for (const Transfer& t : transfers) {
    HP_CHECK(t.from >= 0 && t.to >= 0 && t.from < static_cast<int>(ranks.size()) &&
             t.to < static_cast<int>(ranks.size()))
        << "transfer " << t.from << " -> " << t.to << " names a member outside a group of " << ranks.size();
    if (t.from == t.to || t.bytes <= 0) continue;
    const int lvl = link_level(ranks[t.from], ranks[t.to]);
    const LinkLevel& l = levels_[lvl];
    const double seconds = t.bytes / (l.bandwidth_GBps * 1e9) + l.latency_us * 1e-6;
    c.bytes_per_level[lvl] += t.bytes;
    sending[t.from] += seconds;
    receiving[t.to] += seconds;
  }
  for (size_t i = 0; i < ranks.size(); ++i) c.seconds = std::max({c.seconds, sending[i], receiving[i]});
  return c;
}

}  // namespace hp
