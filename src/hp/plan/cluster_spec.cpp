#include "hp/plan/cluster_spec.h"

#include <fstream>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::plan {

namespace {

// Figures are public ballparks, not measurements: an 8-GPU NVLink server; a 384-device
// SuperPoD whose whole-pod fabric runs at half the in-server rate; a 16k-device cluster of
// such servers behind 400 Gb/s NICs, 512 devices per non-blocking pod, 2:1 oversubscribed spine.
const std::map<std::string, std::string>& presets() {
  static const std::map<std::string, std::string> all = {
      {"server-8", R"(name = "server-8"
[device]
memory_GiB = 80
tflops = 989
[[levels]]
name = "server"
fanout = 8
bandwidth_GBps = 400
latency_us = 2
)"},
      {"superpod-384", R"(name = "superpod-384"
[device]
memory_GiB = 128
tflops = 750
[[levels]]
name = "server"
fanout = 8
bandwidth_GBps = 392
latency_us = 2
[[levels]]
name = "superpod"
fanout = 48
bandwidth_GBps = 196
latency_us = 3
)"},
      {"cluster-16k", R"(name = "cluster-16k"
[device]
memory_GiB = 80
tflops = 989
[[levels]]
name = "server"
fanout = 8
bandwidth_GBps = 400
latency_us = 2
[[levels]]
name = "pod"
fanout = 64
bandwidth_GBps = 50
latency_us = 5
[[levels]]
name = "cluster"
fanout = 32
bandwidth_GBps = 25
latency_us = 10
)"},
  };
  return all;
}

}  // namespace

ClusterSpec parse_cluster_toml(const std::string& text, const std::string& origin) {
  std::istringstream is(text);
  toml::value data;
  try {
    data = toml::parse(is, origin);
  } catch (const std::exception& e) {
    HP_FAIL() << "cannot parse topology TOML " << origin << ": " << e.what();
  }
  auto number = [&](const toml::value& v, const std::string& key, const std::string& where) {
    HP_CHECK(v.contains(key)) << "topology " << origin << ": " << where << " lacks '" << key << "'";
    const auto& x = v.at(key);
    HP_CHECK(x.is_floating() || x.is_integer())
        << "topology " << origin << ": " << where << "." << key << " must be a number";
    return x.is_integer() ? static_cast<double>(x.as_integer()) : x.as_floating();
  };
  try {
    HP_CHECK(data.contains("levels") && data.at("levels").is_array())
        << "topology " << origin << ": expected an array [[levels]]";
    std::vector<LinkLevel> levels;
    int i = 0;
    for (const auto& lv : data.at("levels").as_array()) {
      std::string where = "levels[" + std::to_string(i++) + "]";
      LinkLevel l;
      l.name = lv.contains("name") ? lv.at("name").as_string().str : where;
      double fanout = number(lv, "fanout", where);
      HP_CHECK(fanout >= 1 && fanout == static_cast<int64_t>(fanout))
          << "topology " << origin << ": " << where << ".fanout must be a positive integer, found " << fanout;
      l.fanout = static_cast<int64_t>(fanout);
      l.bandwidth_GBps = number(lv, "bandwidth_GBps", where);
      l.latency_us = number(lv, "latency_us", where);
      levels.push_back(l);
    }
    HP_CHECK(data.contains("device")) << "topology " << origin << ": expected a [device] table";
    DeviceProps dev;
    dev.memory_GiB = number(data.at("device"), "memory_GiB", "device");
    dev.tflops = number(data.at("device"), "tflops", "device");
    HP_CHECK(dev.memory_GiB > 0 && dev.tflops > 0)
        << "topology " << origin << ": expected device memory_GiB > 0 and tflops > 0, found "
        << dev.memory_GiB << " and " << dev.tflops;
    std::string name = data.contains("name") ? data.at("name").as_string().str : origin;
    return ClusterSpec{name, ClusterTopology(levels), dev};
  } catch (const toml::exception& e) {
    HP_FAIL() << "topology " << origin << ": " << e.what();
  }
  throw Error("unreachable");
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

const std::string& cluster_preset_toml(const std::string& name) {
  auto it = presets().find(name);
  HP_CHECK(it != presets().end()) << "unknown topology preset '" << name << "'; expected one of "
                                  << to_string_list(cluster_preset_names()) << " or a .toml file";
  return it->second;
}

ClusterSpec load_cluster(const std::string& name_or_path) {
  if (presets().count(name_or_path)) return parse_cluster_toml(cluster_preset_toml(name_or_path), name_or_path);
  std::ifstream f(name_or_path);
  HP_CHECK(f.good()) << "topology '" << name_or_path << "' is neither a preset "
                     << to_string_list(cluster_preset_names()) << " nor a readable file";
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_cluster_toml(ss.str(), name_or_path);
}

}  // namespace hp::plan
