// The hierarchical form of a collective over ranks on several hosts, and its cost: the
// other half of the one cost model (cluster.h prices the flat form). Level 0 of the
// topology is the host; the ranks of one host talk through shared memory.
//   all-reduce:     reduce-scatter inside each host, all-reduce of 1/L of the data across
//                   hosts (L groups of ranks with the same local index, side by side),
//                   all-gather inside each host
//   all-gather:     across hosts (each rank its own piece), then inside each host
//   reduce-scatter: inside each host, then across hosts
// Pipelined in pieces: the cross-host phase of one piece overlaps the in-host phases of
// the next.
#pragma once

#include <optional>
#include <vector>

#include "hp/topology/cluster.h"

namespace hp {

// `hosts` blocks of `per_host` consecutive ranks: each block inside one unit of level 0,
// every block in a different one.
struct HostBlocks {
  int hosts = 0;
  int per_host = 0;
};

// The blocks of `ranks` (in the order given), or nullopt when the hierarchical form does
// not apply: one host only, one rank on some host, unequal counts, or the ranks of a host
// not consecutive in `ranks`.
std::optional<HostBlocks> host_blocks(const ClusterTopology& topo, const std::vector<int>& ranks);

enum class CollectiveAlgorithm { Flat, Hierarchical };
const char* to_string(CollectiveAlgorithm a);

// Cost of the hierarchical form of `kind` (AllReduce, AllGather or ReduceScatter; `bytes`
// as in ClusterTopology::cost) in pieces of `piece_bytes`. Throws when `ranks` are not
// host blocks or the kind has no hierarchical form.
CollectiveCost hierarchical_cost(const ClusterTopology& topo, Collective kind, double bytes,
                                 const std::vector<int>& ranks, double piece_bytes);

// Hierarchical where it applies and costs less than the flat ring; Flat otherwise.
CollectiveAlgorithm choose_algorithm(const ClusterTopology& topo, Collective kind, double bytes,
                                     const std::vector<int>& ranks, double piece_bytes);

}  // namespace hp
