#include <gtest/gtest.h>

#include "hp/topology/cluster.h"

using hp::ClusterTopology;
using hp::Collective;

TEST(Cluster, LinkLevels) {
  ClusterTopology t({{"server", 8, 100, 2}, {"pod", 4, 25, 10}});
  EXPECT_EQ(t.num_devices(), 32);
  EXPECT_EQ(t.link_level(0, 7), 0);
  EXPECT_EQ(t.link_level(7, 8), 1);
}

TEST(Cluster, RingAllReduceMatchesAlphaBeta) {
  auto t = ClusterTopology::uniform(4, 1.0, 10.0);
  auto c = t.cost(Collective::AllReduce, 4e6, {0, 1, 2, 3});
  // 2 (n-1)/n * bytes / bw + 2 (n-1) * latency
  EXPECT_NEAR(c.seconds, 2 * 0.75 * 4e6 / 1e9 + 6 * 10e-6, 1e-12);
  EXPECT_NEAR(c.total_bytes(), 4 * 2 * 0.75 * 4e6, 1e-6);
}

TEST(Cluster, SlowLinkDominatesAndIsCounted) {
  ClusterTopology t({{"server", 2, 100, 1}, {"net", 2, 10, 10}});
  auto inside = t.cost(Collective::AllGather, 1e6, {0, 1});
  auto across = t.cost(Collective::AllGather, 1e6, {0, 2});
  EXPECT_LT(inside.seconds, across.seconds);
  EXPECT_GT(across.bytes_per_level[1], 0);
  EXPECT_EQ(across.bytes_per_level[0], 0);
  EXPECT_EQ(t.cost(Collective::AllReduce, 1e6, {3}).seconds, 0);
}
