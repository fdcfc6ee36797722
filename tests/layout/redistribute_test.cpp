#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/layout/exchange_box.h"
#include "layout/redistribute_sim.h"

using namespace hp;
using V = std::vector<int64_t>;

namespace {

std::vector<StepKind> kinds(const RedistributePlan& p) {
  std::vector<StepKind> k;
  for (const auto& s : p.steps) k.push_back(s.kind);
  return k;
}

}  // namespace

TEST(Redistribute, OneMeshDimBasics) {
  MeshShape m({4});
  ShardSpec s0({8, 8}, 4, m, {Shard(0)});
  auto plan = [&](Placement a, Placement b) { return min_cost_plan(s0.with_placements({a}), s0.with_placements({b})); };
  EXPECT_EQ(kinds(plan(Shard(0), Shard(1))), std::vector<StepKind>{StepKind::AllToAll});
  EXPECT_EQ(kinds(plan(Shard(0), Replicate())), std::vector<StepKind>{StepKind::AllGather});
  EXPECT_EQ(kinds(plan(Partial(), Shard(1))), std::vector<StepKind>{StepKind::ReduceScatter});
  EXPECT_EQ(kinds(plan(Partial(), Replicate())), std::vector<StepKind>{StepKind::AllReduce});
  EXPECT_EQ(kinds(plan(Replicate(), Shard(1))), std::vector<StepKind>{StepKind::LocalChunk});
  EXPECT_EQ(kinds(plan(Replicate(), Partial())), std::vector<StepKind>{StepKind::LocalReduceToPartial});
  EXPECT_EQ(kinds(plan(Partial(), Partial(ReduceOp::Avg))), std::vector<StepKind>{StepKind::LocalScale});
  EXPECT_EQ(kinds(plan(Shard(0), Partial())),
            (std::vector<StepKind>{StepKind::AllGather, StepKind::LocalReduceToPartial}));
  EXPECT_EQ(kinds(plan(Partial(ReduceOp::Max), Partial(ReduceOp::Min))),
            (std::vector<StepKind>{StepKind::AllReduce, StepKind::LocalReduceToPartial}));
  EXPECT_TRUE(plan(Shard(1), Shard(1)).steps.empty());
  EXPECT_EQ(plan(Replicate(), Shard(0)).cost.seconds, 0);

  // Costs are the topology's: a gather of the 256-byte tensor over 4 ranks.
  auto g = plan(Shard(0), Replicate());
  auto want = ClusterTopology::uniform(4).cost(Collective::AllGather, 256, {0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(g.cost.seconds, want.seconds);
  EXPECT_DOUBLE_EQ(g.cost.total_bytes(), want.total_bytes());
}

// Swapping shard dims across a 2x2 mesh: ranks (0, 1) and (1, 0) trade pieces, the others
// keep theirs. The single-mesh-dim search needs all-to-alls and never a fully replicated
// intermediate either, but moves more.
TEST(Redistribute, SwapShardDimsIsOnePermutation) {
  MeshShape m({2, 2});
  ShardSpec a({8, 8}, 4, m, {Shard(0), Shard(1)});
  ShardSpec b = a.with_placements({Shard(1), Shard(0)});
  RedistributePlan p = min_cost_plan(a, b);
  ASSERT_EQ(kinds(p), std::vector<StepKind>{StepKind::FlattenedAllToAll}) << p.to_string();
  EXPECT_EQ(p.steps[0].mesh_dims, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(p.cost.total_bytes(), 2 * 16 * 4);  // two 4x4 pieces of float32
  EXPECT_TRUE(sim::run(p, sim::iota({8, 8}), a, b));

  RedistributePlan old = min_cost_plan(a, b, ClusterTopology::uniform(4), StepSet::SingleMeshDim);
  bool a2a = false;
  for (const auto& s : old.steps) {
    a2a = a2a || s.kind == StepKind::AllToAll;
    EXPECT_FALSE(s.to.placement(0).is_replicate() && s.to.placement(1).is_replicate()) << old.to_string();
  }
  EXPECT_TRUE(a2a) << old.to_string();
  EXPECT_TRUE(sim::run(old, sim::iota({8, 8}), a, b));
  EXPECT_LT(p.cost.total_bytes(), old.cost.total_bytes());
  EXPECT_LE(old.cost.total_bytes(), per_mesh_dim_plan(a, b).cost.total_bytes());
}

// The two pairs the flattened steps are for, on a [1024, 1024] float32 tensor (4 MiB).
// Bytes are all ranks' sends together, as the cost model counts them.
TEST(Redistribute, FlattenedStepsOnTheExamplePairs) {
  MeshShape m({2, 2});
  ShardSpec base({1024, 1024}, 4, m, {Replicate(), Replicate()});
  const ClusterTopology flat = ClusterTopology::uniform(4);
  struct Case {
    std::vector<Placement> from, to;
    double bytes;  // the flattened plan's
  };
  // Swap: two ranks trade 1 MiB pieces. Transpose of 4 row blocks into 4 column blocks:
  // each rank keeps a quarter of its piece and sends the rest, 3/4 MiB each.
  for (const Case& c : {Case{{Shard(0), Shard(1)}, {Shard(1), Shard(0)}, 2 << 20},
                        Case{{Shard(0), Shard(0)}, {Shard(1), Shard(1)}, 3 << 20}}) {
    ShardSpec a = base.with_placements(c.from), b = base.with_placements(c.to);
    RedistributePlan now = min_cost_plan(a, b, flat);
    RedistributePlan old = min_cost_plan(a, b, flat, StepSet::SingleMeshDim);
    RedistributePlan pytorch = per_mesh_dim_plan(a, b, flat);
    std::printf("%s -> %s: %.2f MB (%s), single-mesh-dim search %.2f MB (%s), per-mesh-dim %.2f MB\n",
                to_string_list(c.from).c_str(), to_string_list(c.to).c_str(), now.cost.total_bytes() / 1e6,
                now.to_string().c_str(), old.cost.total_bytes() / 1e6, old.to_string().c_str(),
                pytorch.cost.total_bytes() / 1e6);
    ASSERT_EQ(kinds(now), std::vector<StepKind>{StepKind::FlattenedAllToAll}) << now.to_string();
    EXPECT_DOUBLE_EQ(now.cost.total_bytes(), c.bytes);
    EXPECT_DOUBLE_EQ(old.cost.total_bytes(), 8 << 20) << old.to_string();
  }
  // The same plans on data small enough to simulate.
  ShardSpec small({12, 10}, 4, m, {Shard(0), Shard(1)});
  for (const auto& [x, y] : {std::pair{std::vector<Placement>{Shard(0), Shard(1)}, std::vector<Placement>{Shard(1), Shard(0)}},
                             std::pair{std::vector<Placement>{Shard(0), Shard(0)}, std::vector<Placement>{Shard(1), Shard(1)}}}) {
    ShardSpec a = small.with_placements(x), b = small.with_placements(y);
    EXPECT_TRUE(sim::run(min_cost_plan(a, b), sim::iota({12, 10}), a, b));
  }
}

// Where the target repeats data, halving the bytes can be out of reach: every rank must
// receive its whole new piece less what it already holds, and for [S(0), S(0), S(0)] ->
// [R, S(0), R] on 2x2x2 that alone is more than half of what the single-mesh-dim search
// moves (its gather and re-slice of mesh dim 1 cost little beside it).
TEST(Redistribute, ReplicatedTargetsCannotAlwaysHalve) {
  MeshShape m({2, 2, 2});
  ShardSpec a({1024, 1024}, 4, m, {Shard(0), Shard(0), Shard(0)});
  ShardSpec b = a.with_placements({Replicate(), Shard(0), Replicate()});
  double least = 0;  // bytes no plan can avoid
  for (int r : m.ranks()) {
    const auto c = m.coord_of(r);
    least += static_cast<double>(box_of(b, c).numel() - intersect(box_of(a, c), box_of(b, c)).numel()) * 4;
  }
  const ClusterTopology flat = ClusterTopology::uniform(8);
  RedistributePlan now = min_cost_plan(a, b, flat), old = min_cost_plan(a, b, flat, StepSet::SingleMeshDim);
  std::printf("%s: new %.1f MB, single-mesh-dim search %.1f MB, at least %.1f MB\n", to_string_list(b.placements()).c_str(),
              now.cost.total_bytes() / 1e6, old.cost.total_bytes() / 1e6, least / 1e6);
  EXPECT_GT(2 * least, old.cost.total_bytes());
  EXPECT_GE(now.cost.total_bytes(), least);
  EXPECT_LT(now.cost.total_bytes(), old.cost.total_bytes());
  ShardSpec x({16, 8}, 4, m, a.placements()), y = x.with_placements(b.placements());
  EXPECT_TRUE(sim::run(min_cost_plan(x, y, flat), sim::iota({16, 8}), x, y));
}

// A flattened step keeps data inside each group along its dims: a change that would move
// data between groups is none.
TEST(Redistribute, FlattenedStepsStayInsideTheirGroups) {
  MeshShape m({2, 2, 2});
  MeshCost cost(m, ClusterTopology::uniform(8));
  ShardSpec a({16, 16}, 4, m, {Shard(0), Shard(0), Replicate()});
  // Over mesh dims 0 and 2, mesh dim 1 still splits the piece mesh dim 0 gave: the group's
  // rows are not those it will need.
  EXPECT_FALSE(flattened_step(a, a.with_placements({Replicate(), Shard(0), Shard(0)}), {0, 2}, cost));
  // Adding an innermost split inside the group is fine, and free.
  auto s = flattened_step(a, a.with_placements({Shard(0), Shard(0), Shard(0)}), {0, 2}, cost);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->cost.total_bytes(), 0);
  // Outside the group nothing may change; inside, nothing may become Partial.
  EXPECT_FALSE(flattened_step(a, a.with_placements({Shard(1), Shard(1), Replicate()}), {0, 2}, cost));
  EXPECT_FALSE(flattened_step(a, a.with_placements({Partial(), Shard(0), Replicate()}), {0, 1}, cost));
  // Groups larger than kMaxFlattenedMembers are not flattened.
  MeshShape big({16, 8});
  ShardSpec g({256, 256}, 4, big, {Shard(0), Shard(1)});
  EXPECT_FALSE(flattened_step(g, g.with_placements({Shard(1), Shard(0)}), {0, 1}, MeshCost(big, ClusterTopology::uniform(128))));
}

TEST(Redistribute, NestedShardingGathersInnermostFirst) {
  MeshShape m({2, 2});
  ShardSpec a({8, 4}, 4, m, {Shard(0), Shard(0)});
  ShardSpec b = a.with_placements({Replicate(), Shard(0)});
  RedistributePlan p = min_cost_plan(a, b, ClusterTopology::uniform(4), StepSet::SingleMeshDim);
  ASSERT_FALSE(p.steps.empty());
  EXPECT_EQ(p.steps[0].mesh_dim, 1) << p.to_string();  // mesh dim 0 cannot gather first
  EXPECT_TRUE(sim::run(p, sim::iota({8, 4}), a, b));
  EXPECT_FALSE(single_step(a, 0, Replicate(), MeshCost(m, ClusterTopology::uniform(4))));
  // A new shard of dim 0 on mesh dim 0 would have to split outside mesh dim 1's.
  EXPECT_FALSE(single_step(a.with_placements({Replicate(), Shard(0)}), 0, Shard(0),
                           MeshCost(m, ClusterTopology::uniform(4))));
}

TEST(Redistribute, UnevenCollectivesArePaddedToTheLargestPiece) {
  MeshShape m({3});
  ShardSpec a({5}, 8, m, {Shard(0)});  // pieces 2, 2, 1
  RedistributePlan p = min_cost_plan(a, a.with_placements({Replicate()}));
  auto want = ClusterTopology::uniform(3).cost(Collective::AllGather, 3 * 2 * 8, {0, 1, 2});
  EXPECT_DOUBLE_EQ(p.cost.seconds, want.seconds);
  EXPECT_TRUE(sim::run(p, sim::iota({5}), a, a.with_placements({Replicate()})));
}

TEST(Redistribute, TopologyPricesEachMeshDim) {
  // Mesh dim 1 stays inside 2-device servers; mesh dim 0 crosses the slow network.
  ClusterTopology topo({{"server", 2, 100, 1}, {"net", 2, 10, 10}});
  MeshShape m({2, 2});
  ShardSpec r({64, 64}, 4, m, {Replicate(), Replicate()});
  RedistributePlan across = min_cost_plan(r.with_placements({Shard(0), Replicate()}), r, topo);
  RedistributePlan inside = min_cost_plan(r.with_placements({Replicate(), Shard(0)}), r, topo);
  EXPECT_GT(across.cost.bytes_per_level[1], 0);
  EXPECT_EQ(across.cost.bytes_per_level[0], 0);
  EXPECT_GT(inside.cost.bytes_per_level[0], 0);
  EXPECT_EQ(inside.cost.bytes_per_level[1], 0);
  EXPECT_GT(across.cost.seconds, inside.cost.seconds);
  // Both groups along a mesh dim are counted.
  auto one = topo.cost(Collective::AllGather, 64 * 64 * 4, {0, 1});
  EXPECT_DOUBLE_EQ(inside.cost.total_bytes(), 2 * one.total_bytes());
}

TEST(Redistribute, PlansLargeMeshesQuickly) {
  // 16384 ranks: pricing looks at one group per link pattern, not every group.
  ClusterTopology topo({{"server", 8, 200, 2}, {"pod", 64, 50, 5}, {"net", 32, 12.5, 20}});
  MeshShape m({128, 16, 8}, {"dp", "cp", "tp"});
  ShardSpec a({4096, 8192, 64}, 2, m, {Shard(0), Shard(1), Partial()});
  ShardSpec b = a.with_placements({Shard(1), Replicate(), Shard(0)});
  RedistributePlan p = min_cost_plan(a, b, topo);
  EXPECT_FALSE(p.steps.empty());
  EXPECT_LE(p.cost.seconds, per_mesh_dim_plan(a, b, topo).cost.seconds);
}

TEST(Redistribute, ErrorsNameBothSpecs) {
  ShardSpec a({4, 4}, 4, MeshShape({2}), {Shard(0)});
  ShardSpec b({4, 5}, 4, MeshShape({2}), {Shard(0)});
  try {
    min_cost_plan(a, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(min_cost_plan(a, ShardSpec({4, 4}, 4, MeshShape({2}, {}, {1, 0}), {Shard(0)})), Error);
}

TEST(Redistribute, CacheIsSharedAndThreadSafe) {
  clear_redistribute_cache();
  MeshShape m({2, 2});
  ShardSpec base({6, 4}, 4, m, {Replicate(), Replicate()});
  std::vector<Placement> opts{Replicate(), Shard(0), Shard(1), Partial()};
  std::vector<ShardSpec> specs;
  for (const auto& p : opts)
    for (const auto& q : opts) specs.push_back(base.with_placements({p, q}));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (const auto& a : specs)
        for (const auto& b : specs) plan_redistribute(a, b);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(redistribute_cache_size(), specs.size() * specs.size());
  auto p1 = plan_redistribute(specs[1], specs[6]);
  EXPECT_EQ(p1.get(), plan_redistribute(specs[1], specs[6]).get());
  EXPECT_EQ(p1->to_string(), min_cost_plan(specs[1], specs[6]).to_string());
  // Another topology is another plan.
  plan_redistribute(specs[1], specs[6], ClusterTopology({{"server", 2, 100, 1}, {"net", 2, 10, 10}}));
  EXPECT_EQ(redistribute_cache_size(), specs.size() * specs.size() + 1);
  clear_redistribute_cache();
  EXPECT_EQ(redistribute_cache_size(), 0u);
}

// Where PyTorch's per-mesh-dim order gathers only to re-shard, the search chunks first
// and moves a quarter of the bytes.
TEST(Redistribute, BeatsPerMeshDimWhereItRoundTripsThroughReplicate) {
  MeshShape m({2, 2});
  ShardSpec a({16, 16}, 4, m, {Replicate(), Shard(0)});
  ShardSpec b = a.with_placements({Shard(1), Shard(1)});
  RedistributePlan p = min_cost_plan(a, b), base = per_mesh_dim_plan(a, b);
  EXPECT_EQ(base.steps[0].kind, StepKind::AllGather) << base.to_string();
  EXPECT_GE(base.cost.total_bytes(), 2 * p.cost.total_bytes()) << p.to_string() << " vs " << base.to_string();
  EXPECT_TRUE(sim::run(p, sim::iota({16, 16}), a, b));
  EXPECT_TRUE(sim::run(base, sim::iota({16, 16}), a, b));
}

// Found by fuzz/planner_fuzz: size-1 mesh dims still fix the split order, and partials of
// ops that cannot mix must be reduced before the other appears.
TEST(Redistribute, PerMeshDimHandlesSizeOneDimsAndMixedPartials) {
  ShardSpec a({11}, 4, MeshShape({1, 1}), {Shard(0), Replicate()});
  ShardSpec b = a.with_placements({Replicate(), Shard(0)});
  for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
    EXPECT_TRUE(sim::run(per_mesh_dim_plan(x, y), sim::iota({11}), x, y));
    EXPECT_TRUE(sim::run(min_cost_plan(x, y), sim::iota({11}), x, y));
  }
  ShardSpec c({6}, 4, MeshShape({4, 2}), {Replicate(), Partial(ReduceOp::Max)});
  ShardSpec d = c.with_placements({Partial(), Replicate()});
  RedistributePlan p = per_mesh_dim_plan(c, d);
  EXPECT_TRUE(sim::run(p, sim::iota({6}), c, d)) << p.to_string();
  EXPECT_TRUE(sim::run(min_cost_plan(c, d), sim::iota({6}), c, d));
}
