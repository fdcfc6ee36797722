#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "hp/base/error.h"
#include "hp/plan/cluster_spec.h"

using namespace hp::plan;

TEST(ClusterSpec, Presets) {
  EXPECT_EQ(load_cluster("server-8").num_devices(), 8);
  EXPECT_EQ(load_cluster("superpod-384").num_devices(), 384);
  ClusterSpec big = load_cluster("cluster-16k");
  EXPECT_EQ(big.num_devices(), 16384);
  EXPECT_EQ(big.topology.levels().size(), 3u);
  EXPECT_GT(big.device.memory_GiB, 0);
  EXPECT_GT(big.device.tflops, 0);
}

TEST(ClusterSpec, ParsesTomlAndFiles) {
  const std::string text = R"(name = "two-servers"
[device]
memory_GiB = 16
tflops = 100.5
[[levels]]
name = "server"
fanout = 4
bandwidth_GBps = 100
latency_us = 1.5
[[levels]]
name = "net"
fanout = 2
bandwidth_GBps = 10
latency_us = 10
)";
  ClusterSpec c = parse_cluster_toml(text, "inline");
  EXPECT_EQ(c.name, "two-servers");
  EXPECT_EQ(c.num_devices(), 8);
  EXPECT_DOUBLE_EQ(c.device.tflops, 100.5);
  EXPECT_DOUBLE_EQ(c.topology.levels()[0].latency_us, 1.5);
  EXPECT_EQ(c.topology.link_level(3, 4), 1);

  const std::string path = ::testing::TempDir() + "hp_topology_test.toml";
  std::ofstream(path) << text;
  EXPECT_EQ(load_cluster(path).num_devices(), 8);
  std::remove(path.c_str());
}

TEST(ClusterSpec, ErrorsNameTheProblem) {
  auto message = [](const std::string& text) {
    try {
      parse_cluster_toml(text, "t.toml");
    } catch (const hp::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[device]\nmemory_GiB = 1\ntflops = 1\n[[levels]]\nname = \"s\"\nbandwidth_GBps = 1\n"
                    "latency_us = 1\n")
                .find("fanout"),
            std::string::npos);
  EXPECT_NE(message("[[levels]]\nfanout = 2\nbandwidth_GBps = 1\nlatency_us = 1\n").find("[device]"),
            std::string::npos);
  EXPECT_NE(message("this is = = not toml").find("t.toml"), std::string::npos);
  EXPECT_THROW(load_cluster("no-such-topology"), hp::Error);
}
