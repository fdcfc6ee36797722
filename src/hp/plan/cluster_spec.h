// A cluster for planning: the network (ClusterTopology) plus what each device offers.
// Described in TOML:
//   name = "server-8"
//   [device]
//   memory_GiB = 80
//   tflops = 989            # dense bf16 peak, TFLOP/s
//   [[levels]]              # innermost first
//   name = "server"
//   fanout = 8
//   bandwidth_GBps = 400    # per device, one direction
//   latency_us = 2
#pragma once

#include <string>
#include <vector>

#include "hp/topology/cluster.h"

namespace hp::plan {

struct DeviceProps {
  double memory_GiB = 0;
  double tflops = 0;
};

struct ClusterSpec {
  std::string name;
  ClusterTopology topology;
  DeviceProps device;

  int64_t num_devices() const { return topology.num_devices(); }
};

ClusterSpec parse_cluster_toml(const std::string& text, const std::string& origin);
// Presets: server-8, superpod-384, cluster-16k.
std::vector<std::string> cluster_preset_names();
const std::string& cluster_preset_toml(const std::string& name);  // throws listing the presets
// A preset name or a TOML file path.
ClusterSpec load_cluster(const std::string& name_or_path);

}  // namespace hp::plan
