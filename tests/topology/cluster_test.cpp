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

TEST(Cluster, ExchangeOfEqualPiecesIsAnAllToAll) {
  ClusterTopology t({{"server", 2, 100, 1}, {"net", 4, 10, 10}});
  const std::vector<int> ranks{0, 1, 2, 5};
  std::vector<hp::Transfer> every_pair;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) every_pair.push_back({i, j, 1e6 / 4});  // to oneself: free
  auto a2a = t.cost(Collective::AllToAll, 1e6, ranks), ex = t.exchange_cost(ranks, every_pair);
  EXPECT_DOUBLE_EQ(ex.seconds, a2a.seconds);
  ASSERT_EQ(ex.bytes_per_level.size(), a2a.bytes_per_level.size());
  for (size_t l = 0; l < a2a.bytes_per_level.size(); ++l) EXPECT_DOUBLE_EQ(ex.bytes_per_level[l], a2a.bytes_per_level[l]);
}

TEST(Cluster, ExchangeTimeIsTheBusiestRankEitherWay) {
  auto t = ClusterTopology::uniform(4, 1.0, 10.0);
  // Ranks 1, 2 and 3 each send 1 MB to rank 0: rank 0 receives three pieces in a row.
  auto c = t.exchange_cost({0, 1, 2, 3}, {{1, 0, 1e6}, {2, 0, 1e6}, {3, 0, 1e6}});
  EXPECT_NEAR(c.seconds, 3 * (1e6 / 1e9 + 10e-6), 1e-12);
  EXPECT_DOUBLE_EQ(c.total_bytes(), 3e6);
  // A swap of two pieces: each rank sends one and receives one.
  EXPECT_NEAR(t.exchange_cost({0, 1, 2, 3}, {{1, 2, 1e6}, {2, 1, 1e6}}).seconds, 1e6 / 1e9 + 10e-6, 1e-12);
}
