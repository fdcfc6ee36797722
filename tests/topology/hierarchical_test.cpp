#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/topology/hierarchical.h"

using namespace hp;

namespace {
// Two ranks per host over shared memory, hosts joined by a 1 Gbit/s link.
ClusterTopology two_per_host(int hosts) { return ClusterTopology({{"host", 2, 10, 2}, {"net", hosts, 0.125, 30}}); }
constexpr double MiB = 1 << 20;
}  // namespace

TEST(Hierarchical, HostBlocksNeedEqualConsecutiveBlocks) {
  auto t = two_per_host(4);
  auto b = host_blocks(t, {0, 1, 2, 3, 4, 5});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->hosts, 3);
  EXPECT_EQ(b->per_host, 2);
  EXPECT_TRUE(host_blocks(t, {2, 3, 6, 7}));         // any hosts, in any order
  EXPECT_FALSE(host_blocks(t, {0, 2, 1, 3}));        // a host's ranks apart
  EXPECT_FALSE(host_blocks(t, {0, 1, 2}));           // unequal
  EXPECT_FALSE(host_blocks(t, {0, 2, 4}));           // one rank per host
  EXPECT_FALSE(host_blocks(t, {0, 1}));              // one host
  EXPECT_FALSE(host_blocks(ClusterTopology::uniform(4), {0, 1, 2, 3}));
}

TEST(Hierarchical, AllReduceSendsTwoThirdsOfTheRingsCrossHostBytes) {
  auto t = two_per_host(2);
  const std::vector<int> ranks{0, 1, 2, 3};
  auto flat = t.cost(Collective::AllReduce, 64 * MiB, ranks);
  auto hier = hierarchical_cost(t, Collective::AllReduce, 64 * MiB, ranks, 4 * MiB);
  EXPECT_NEAR(flat.bytes_per_level[1] / hier.bytes_per_level[1], 1.5, 1e-9);
  EXPECT_LT(hier.seconds, flat.seconds);
  EXPECT_EQ(choose_algorithm(t, Collective::AllReduce, 64 * MiB, ranks, 4 * MiB), CollectiveAlgorithm::Hierarchical);
  for (auto k : {Collective::AllGather, Collective::ReduceScatter}) {
    auto f = t.cost(k, 64 * MiB, ranks), h = hierarchical_cost(t, k, 64 * MiB, ranks, 4 * MiB);
    EXPECT_NEAR(f.bytes_per_level[1] / h.bytes_per_level[1], 1.5, 1e-9) << to_string(k);
    EXPECT_EQ(choose_algorithm(t, k, 64 * MiB, ranks, 4 * MiB), CollectiveAlgorithm::Hierarchical);
  }
}

TEST(Hierarchical, PiecesOverlapThePhases) {
  // Hosts as fast as shared memory: the phases take comparable time, so pieces pay off.
  ClusterTopology t({{"host", 2, 2, 0}, {"net", 2, 1, 0}});
  const std::vector<int> ranks{0, 1, 2, 3};
  auto one = hierarchical_cost(t, Collective::AllReduce, 64 * MiB, ranks, 64 * MiB);
  auto many = hierarchical_cost(t, Collective::AllReduce, 64 * MiB, ranks, 4 * MiB);
  EXPECT_LT(many.seconds, 0.6 * one.seconds);
  EXPECT_NEAR(many.total_bytes(), one.total_bytes(), 1e-3);
}

TEST(Hierarchical, FlatWhereItDoesNotApplyOrCostsLess) {
  auto t = two_per_host(2);
  EXPECT_EQ(choose_algorithm(t, Collective::AllReduce, MiB, {0, 2, 1, 3}, MiB), CollectiveAlgorithm::Flat);
  EXPECT_EQ(choose_algorithm(t, Collective::AllToAll, MiB, {0, 1, 2, 3}, MiB), CollectiveAlgorithm::Flat);
  // Small messages where a host's barrier costs more than a network hop: two in-host
  // phases do not pay (the flat ring's latency is the network's).
  ClusterTopology slow({{"host", 2, 10, 1000}, {"net", 2, 10, 30}});
  EXPECT_EQ(choose_algorithm(slow, Collective::AllReduce, 1024, {0, 1, 2, 3}, 4 * MiB), CollectiveAlgorithm::Flat);
  EXPECT_THROW(hierarchical_cost(t, Collective::AllReduce, MiB, {0, 2}, MiB), Error);
}
