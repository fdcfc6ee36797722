#include "hp/topology/hierarchical.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "hp/base/error.h"

namespace hp {

std::optional<HostBlocks> host_blocks(const ClusterTopology& topo, const std::vector<int>& ranks) {
  const int64_t per_unit = topo.levels().front().fanout;
  auto host = [&](int r) { return r / per_unit; };
  std::vector<int> sizes;
  std::set<int64_t> seen;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0 && host(ranks[i]) == host(ranks[i - 1])) {
      ++sizes.back();
      continue;
    }
    if (!seen.insert(host(ranks[i])).second) return std::nullopt;  // a host's ranks not consecutive
    sizes.push_back(1);
  }
  if (sizes.size() < 2 || sizes.front() < 2) return std::nullopt;
  if (!std::all_of(sizes.begin(), sizes.end(), [&](int s) { return s == sizes.front(); })) return std::nullopt;
  return HostBlocks{static_cast<int>(sizes.size()), sizes.front()};
}

const char* to_string(CollectiveAlgorithm a) {
  return a == CollectiveAlgorithm::Hierarchical ? "hierarchical" : "flat";
}

CollectiveCost hierarchical_cost(const ClusterTopology& topo, Collective kind, double bytes,
                                 const std::vector<int>& ranks, double piece_bytes) {
  auto blocks = host_blocks(topo, ranks);
  HP_CHECK(blocks) << "hierarchical " << to_string(kind) << ": the " << ranks.size()
                   << " ranks are not laid out as equal consecutive blocks of 2 or more ranks on 2 or more hosts";
  HP_CHECK(kind == Collective::AllReduce || kind == Collective::AllGather || kind == Collective::ReduceScatter)
      << "hierarchical cost of " << to_string(kind) << ": only all_reduce, all_gather and reduce_scatter have one";
  HP_CHECK(piece_bytes > 0) << "hierarchical cost: piece size must be positive, got " << piece_bytes;
  const int H = blocks->hosts, L = blocks->per_host;
  const double pieces = std::max(1.0, std::ceil(bytes / piece_bytes));
  const double b = bytes / pieces;  // one piece

  // The phases of one piece: `inner` runs on every host at once, `outer` on the L groups
  // of equal local index at once; the slowest instance sets each phase's time.
  CollectiveCost total;
  total.bytes_per_level.assign(topo.levels().size(), 0.0);
  auto phase = [&](Collective k, double piece, const std::vector<std::vector<int>>& groups) {
    double worst = 0;
    for (const auto& members : groups) {
      CollectiveCost c = topo.cost(k, piece, members);
      worst = std::max(worst, c.seconds);
      for (double& x : c.bytes_per_level) x *= pieces;
      c.seconds = 0;
      total += c;
    }
    return worst;
  };
  std::vector<std::vector<int>> hosts(H), peers(L);  // the ranks of each host; of each local index
  for (int h = 0; h < H; ++h)
    for (int l = 0; l < L; ++l) hosts[h].push_back(ranks[h * L + l]), peers[l].push_back(ranks[h * L + l]);
  auto inner = [&](Collective k, double piece) { return phase(k, piece, hosts); };
  auto outer = [&](Collective k, double piece) { return phase(k, piece, peers); };
  // before / across / after: the in-host phase ahead of the cross-host one, and behind it.
  double before = 0, across = 0, after = 0;
  switch (kind) {
    case Collective::AllReduce:
      before = inner(Collective::ReduceScatter, b);
      across = outer(Collective::AllReduce, b / L);
      after = inner(Collective::AllGather, b);
      break;
    case Collective::AllGather:  // `bytes`: the gathered output
      across = outer(Collective::AllGather, b / L);
      after = inner(Collective::AllGather, b);
      break;
    default:  // ReduceScatter, `bytes`: the input
      before = inner(Collective::ReduceScatter, b);
      across = outer(Collective::ReduceScatter, b / L);
      break;
  }
  // One thread runs the in-host phases in order while the cross-host phase of the
  // previous piece proceeds: after the first piece, each piece costs the longer of the two.
  total.seconds = before + across + after + (pieces - 1) * std::max(before + after, across);
  return total;
}

CollectiveAlgorithm choose_algorithm(const ClusterTopology& topo, Collective kind, double bytes,
                                     const std::vector<int>& ranks, double piece_bytes) {
  if (kind != Collective::AllReduce && kind != Collective::AllGather && kind != Collective::ReduceScatter)
    return CollectiveAlgorithm::Flat;
  if (!host_blocks(topo, ranks)) return CollectiveAlgorithm::Flat;
  const double flat = topo.cost(kind, bytes, ranks).seconds;
  const double hier = hierarchical_cost(topo, kind, bytes, ranks, piece_bytes).seconds;
  return hier < flat ? CollectiveAlgorithm::Hierarchical : CollectiveAlgorithm::Flat;
}

}  // namespace hp
