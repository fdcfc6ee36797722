// Cluster topology as nested levels (chip -> server -> SuperPoD -> cluster) and the
// one cost model of a collective that the planner, dry-run and search all share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hp {

// One level of the network. `fanout` units of the level below form one unit here:
// level 0 with fanout 8 is an 8-device server; level 1 with fanout 48 joins 48 servers.
struct LinkLevel {
  std::string name;
  int64_t fanout = 1;
  double bandwidth_GBps = 1;  // per device, one direction
  double latency_us = 10;
};

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, SendRecv };
const char* to_string(Collective c);

struct CollectiveCost {
  double seconds = 0;
  std::vector<double> bytes_per_level;  // bytes crossing links of each level, all ranks together
  double total_bytes() const;
  CollectiveCost& operator+=(const CollectiveCost& o);
};

// Bytes that one member of a group sends another; members are indices into the group.
struct Transfer {
  int from = 0;
  int to = 0;
  double bytes = 0;
};

class ClusterTopology {
 public:
  explicit ClusterTopology(std::vector<LinkLevel> levels);
  // One flat level: every pair of ranks talks at the same bandwidth and latency.
  static ClusterTopology uniform(int64_t devices, double bandwidth_GBps = 1.0, double latency_us = 20.0);

  const std::vector<LinkLevel>& levels() const { return levels_; }
  int64_t num_devices() const;
  // The level of the link between two ranks: the lowest level whose unit holds both.
  int link_level(int a, int b) const;

  // Cost of a collective over `ranks` (ring order as given, point-to-point for all_to_all).
  // `bytes` is the size of the whole logical buffer: the all-reduced tensor, the gathered
  // output, the reduce-scattered input, one rank's all-to-all input, the broadcast tensor.
  CollectiveCost cost(Collective kind, double bytes, const std::vector<int>& ranks) const;

  // Cost of point-to-point `transfers` among `ranks`, all issued at once: a rank sends its
  // pieces one after another and receives them likewise, and the busiest rank either way
  // sets the time. A transfer to oneself is a local copy, free. With bytes / n between
  // every pair this is cost(AllToAll, bytes, ranks).
  CollectiveCost exchange_cost(const std::vector<int>& ranks, const std::vector<Transfer>& transfers) const;

 private:
  std::vector<LinkLevel> levels_;
};

}  // namespace hp
