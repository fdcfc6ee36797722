#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/simulate.h"

using namespace hp::schedule;

TEST(ScheduleSimulate, LatencyAddsToEachHop) {
  // One microbatch over two ranks: F, hop, F, B, hop, B.
  CostModel c;
  c.uniform = {1, 2, 1, 1};
  c.latency = 0.5;
  const SimResult r = simulate(make_schedule("1f1b", 2, 1), c);
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2);
  EXPECT_DOUBLE_EQ(r.busy[0], 3);
  EXPECT_DOUBLE_EQ(r.bubble_ratio, 1 - 6.0 / (2 * 7));
}

TEST(ScheduleSimulate, ActivationsMayTakeTheirOwnLatency) {
  // The same hops, the forward one slower: F, 1.5, F, B, 0.5, B.
  CostModel c;
  c.uniform = {1, 2, 1, 1};
  c.latency = 0.5;
  c.activation_latency = 1.5;
  EXPECT_DOUBLE_EQ(simulate(make_schedule("1f1b", 2, 1), c).makespan, 1 + 1.5 + 1 + 2 + 0.5 + 2);
}

TEST(ScheduleSimulate, TimelineFollowsListOrder) {
  const Schedule s = make_schedule("gpipe", 3, 4);
  const SimResult r = simulate(s);
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_EQ(r.timeline[rank].size(), s.actions[rank].size());
    double t = 0;
    for (size_t k = 0; k < r.timeline[rank].size(); ++k) {
      EXPECT_EQ(r.timeline[rank][k].action, s.actions[rank][k]);
      EXPECT_GE(r.timeline[rank][k].start, t);
      EXPECT_GE(r.timeline[rank][k].end, r.timeline[rank][k].start);
      t = r.timeline[rank][k].end;
    }
  }
  // Rank 2's first forward waits for two forwards upstream.
  EXPECT_DOUBLE_EQ(r.timeline[2][1].start, 2);
}

TEST(ScheduleSimulate, PerStageCostsAndSlowestStage) {
  CostModel c;
  c.per_stage = {{1, 2, 1, 1}, {3, 6, 3, 3}};  // stage 1 three times slower
  const SimResult r = simulate(make_schedule("gpipe", 2, 4), c);
  // Stage 1 is the bottleneck: it runs 4 F and 4 B back to back after the first F.
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 4 * 3 + 4 * 6 + 2);
  c.per_stage.pop_back();
  EXPECT_THROW(simulate(make_schedule("gpipe", 2, 4), c), hp::Error);
}

TEST(ScheduleSimulate, RendezvousSendsWaitForTheReceiver) {
  CostModel c;
  c.send_capacity = 0;
  const SimResult r = simulate(make_schedule("gpipe", 2, 2), c);
  // Rank 0's second send cannot finish before rank 1 finishes F1.0 and receives.
  const TimedAction& send1 = r.timeline[0][3];
  EXPECT_EQ(to_string(send1.action), "SEND_F0.1>1");
  EXPECT_DOUBLE_EQ(send1.end, 2);
  EXPECT_THROW(simulate(make_schedule("1f1b", 2, 3), c), hp::Error);  // deadlocks
}

TEST(ScheduleSimulate, PeakInFlightNeedsNoTiming) {
  EXPECT_EQ(peak_in_flight(one_f_one_b(4, 8)), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(peak_in_flight(gpipe(2, 5)), (std::vector<int>{5, 5}));
  EXPECT_EQ(peak_in_flight(zb_h1(4, 8)), (std::vector<int>{4, 4, 4, 4}));
}

// The first stage computes no input gradient, so its B is cheaper than the others'. Costed
// per stage, 1F1B's rank 0 then idles by what it saves (every B of the step) and the step
// ends earlier by one saving only (its last B closes the step); costed uniformly, rank 0
// would look as busy as the others. The emulated-device bench calibrates stages this way.
TEST(ScheduleSimulate, ACheaperFirstStageIdlesRankZero) {
  const Schedule s = make_schedule("1f1b", 4, 8);
  CostModel uniform;
  uniform.uniform = {1, 2, 1, 1};
  const SimResult u = simulate(s, uniform);
  EXPECT_DOUBLE_EQ(u.makespan, (8 + 4 - 1) * 3);
  CostModel first_cheaper;
  first_cheaper.per_stage.assign(4, {1, 2, 1, 1});
  first_cheaper.per_stage[0].b = 1.5;
  const SimResult r = simulate(s, first_cheaper);
  EXPECT_DOUBLE_EQ(r.makespan, u.makespan - 0.5);
  EXPECT_DOUBLE_EQ(r.busy[0], 8 * 2.5);
  for (int rank = 1; rank < 4; ++rank) EXPECT_DOUBLE_EQ(r.busy[rank], 8 * 3) << "rank " << rank;
  EXPECT_GT(1 - r.busy[0] / r.makespan, 1 - u.busy[0] / u.makespan + 0.1);
}

// Ranks sharing cores (CostModel::cores). Enough cores: the timing of a core each.
TEST(ScheduleSimulateOnCores, EnoughCoresChangeNothing) {
  for (const char* kind : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"}) {
    const Schedule s = make_schedule(kind, 4, 8);
    CostModel c;
    c.uniform = {1, 2, 1, 1};
    c.latency = 0.1;
    const double alone = simulate(s, c).makespan;
    c.cores = 4;
    EXPECT_DOUBLE_EQ(simulate(s, c).makespan, alone) << kind;
    c.cores = 2, c.host_share.assign(s.num_stages, 0);  // nothing needs a core
    EXPECT_NEAR(simulate(s, c).makespan, alone, 1e-9) << kind;
  }
}

// On one core with every action all host work, the core never idles while any rank has
// work ready: the step takes the sum of all the work.
TEST(ScheduleSimulateOnCores, OneCoreSerialisesTheWork) {
  CostModel c;
  c.uniform = {1, 2, 1, 1};
  c.cores = 1;
  EXPECT_NEAR(simulate(make_schedule("gpipe", 2, 4), c).makespan, 2 * 4 * 3, 1e-9);
}

// GPipe, 2 ranks, 2 microbatches, half of each action on the host, one core. A core each:
// rank 0 F0 [0, 1] F1 [1, 2]; rank 1 F0 [1, 2] F1 [2, 3] B0 [3, 5] B1 [5, 7]; rank 0 B0
// [5, 7] B1 [7, 9]. Shared: rank 0's F1 and rank 1's F0 share the core for their host
// halves (0.5 each at half speed: [1, 2]), then wait 0.5: both end at 2.5; rank 1's F1
// [2.5, 3.5], B0 [3.5, 5.5]; rank 0's B0 and rank 1's B1 share it ([5.5, 7.5]) and wait
// 1: 8.5; rank 0's B1 [8.5, 10.5].
TEST(ScheduleSimulateOnCores, HostHalvesShareTheCore) {
  const Schedule s = make_schedule("gpipe", 2, 2);
  CostModel c;
  c.uniform = {1, 2, 1, 1};
  EXPECT_DOUBLE_EQ(simulate(s, c).makespan, 9);
  c.cores = 1, c.host_share = {0.5, 0.5};
  const SimResult r = simulate(s, c);
  EXPECT_NEAR(r.makespan, 10.5, 1e-9);
  auto compute = [&](int rank, int k) {  // the k-th compute action of `rank`
    for (const TimedAction& t : r.timeline[rank])
      if (is_compute(t.action.type) && k-- == 0) return t;
    return TimedAction{};
  };
  EXPECT_NEAR(compute(0, 1).end, 2.5, 1e-9);
  EXPECT_NEAR(compute(1, 0).end, 2.5, 1e-9);
  EXPECT_NEAR(compute(1, 2).start, 3.5, 1e-9);
  EXPECT_NEAR(compute(0, 2).end, 8.5, 1e-9);
  EXPECT_NEAR(compute(1, 3).end, 8.5, 1e-9);
  c.host_share = {0.5};
  EXPECT_THROW(simulate(s, c), hp::Error);  // one share for two stages
}
