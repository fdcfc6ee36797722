#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/lower.h"
#include "hp/schedule/simulate.h"
#include "hp/schedule/validate.h"

using namespace hp::schedule;

namespace {

double bubble(const std::string& kind, int p, int m, int v = 0) {
  return simulate(make_schedule(kind, p, m, v)).bubble_ratio;
}

}  // namespace

// Every generator, on 2 and 4 ranks, for 1..8 microbatches (fewer than stages
// included), yields a schedule that validates and simulates. dualpipev rejects
// m < 2p (see dualpipev_test.cpp), so it is checked from m = 2p.
TEST(ScheduleGenerators, AllKindsValidate) {
  for (const std::string& kind : schedule_kinds())
    for (int p : {2, 4})
      for (int m = 1; m <= 8; ++m) {
        if (kind == "dualpipev" && m < 2 * p) continue;
        SCOPED_TRACE(kind + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const Schedule s = make_schedule(kind, p, m);
        EXPECT_NO_THROW(validate(s));
        EXPECT_EQ(s.num_ranks, p);
        EXPECT_EQ(s.num_microbatches, m);
        EXPECT_GT(simulate(s).makespan, 0);
      }
}

TEST(ScheduleGenerators, InterleavedValidatesForManyShapes) {
  for (int v : {1, 2, 3, 4})
    for (int p : {1, 2, 3, 4})
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE("v=" + std::to_string(v) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        const Schedule s = make_schedule("interleaved-1f1b", p, m, v);
        EXPECT_EQ(s.num_stages, v * p);
        EXPECT_NO_THROW(validate(s));
      }
}

TEST(ScheduleGenerators, SingleRankNeedsNoComm) {
  for (const std::string& kind : schedule_kinds()) {
    if (kind == "dualpipev") continue;  // needs 2 ranks
    const Schedule s = make_schedule(kind, 1, 3);
    EXPECT_FALSE(s.has_comm()) << kind;
    EXPECT_NO_THROW(validate(s)) << kind;
  }
}

TEST(ScheduleGenerators, BubbleClosedForms) {
  for (int p : {2, 4})
    for (int m = 1; m <= 8; ++m) {
      const double expect = double(p - 1) / (m + p - 1);
      EXPECT_NEAR(bubble("gpipe", p, m), expect, 1e-12) << "p=" << p << " m=" << m;
      EXPECT_NEAR(bubble("1f1b", p, m), expect, 1e-12) << "p=" << p << " m=" << m;
    }
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 3 * p})
        EXPECT_NEAR(bubble("interleaved-1f1b", p, m, v), double(p - 1) / (v * m + p - 1), 1e-12)
            << "p=" << p << " v=" << v << " m=" << m;
}

TEST(ScheduleGenerators, ZeroBubbleBeatsOneFOneB) {
  for (int p : {2, 4})
    for (int m : {p, 2 * p}) {
      const double one = bubble("1f1b", p, m);
      EXPECT_LT(bubble("zb-h1", p, m), one) << "p=" << p << " m=" << m;
      EXPECT_LT(bubble("zbv", p, m), one) << "p=" << p << " m=" << m;
    }
  // ZB-H1's bubble is (p-1)(F + I - W): with F = I = W = 1 a third of 1F1B's.
  const SimResult zb = simulate(make_schedule("zb-h1", 4, 8));
  EXPECT_DOUBLE_EQ(zb.makespan, 8 * 3 + 3 * 1);
}

TEST(ScheduleGenerators, PeakInFlight) {
  for (int p : {2, 4})
    for (int m : {1, 3, 8}) {
      const auto gp = simulate(make_schedule("gpipe", p, m)).peak_in_flight;
      const auto one = simulate(make_schedule("1f1b", p, m)).peak_in_flight;
      const auto zb = simulate(make_schedule("zb-h1", p, m)).peak_in_flight;
      const auto v = simulate(make_schedule("zbv", p, m)).peak_in_flight;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gp[r], m);
        EXPECT_EQ(one[r], std::min(p - r, m));
        EXPECT_LE(zb[r], p);
        EXPECT_LE(v[r], 2 * p);  // two half-size stages per rank: p stages' worth
      }
    }
}

TEST(ScheduleGenerators, OneFOneBOrder) {
  const Schedule s = one_f_one_b(4, 8);
  EXPECT_EQ(s.to_string(false).substr(0, s.to_string(false).find('\n')),
            "rank 0: F0.0 F0.1 F0.2 F0.3 B0.0 F0.4 B0.1 F0.5 B0.2 F0.6 B0.3 F0.7 B0.4 B0.5 B0.6 B0.7");
}

TEST(ScheduleGenerators, VMapTurnHasNoTransfer) {
  const Schedule s = make_schedule("zbv", 4, 4);
  EXPECT_EQ(s.stage_to_rank, v_stage_map(4));
  for (const Action& a : s.actions[3])
    if (is_comm(a.type)) EXPECT_NE(a.peer, 3);
  // Stage 3 -> 4 stays on rank 3: no SEND_F3.x anywhere.
  for (const auto& list : s.actions)
    for (const Action& a : list) EXPECT_FALSE(a.type == ActionType::SEND_F && a.stage == 3);
}

TEST(ScheduleGenerators, RejectsBadArguments) {
  EXPECT_THROW(make_schedule("1f1b", 4, 0), hp::Error);
  EXPECT_THROW(make_schedule("gpipe", 0, 4), hp::Error);
  EXPECT_THROW(make_schedule("1f1b", 4, 4, 2), hp::Error);
  EXPECT_THROW(make_schedule("zbv", 4, 4, 3), hp::Error);
  EXPECT_THROW(interleaved_1f1b(4, 4, 0), hp::Error);
  try {
    make_schedule("chimera", 4, 4);
    FAIL();
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown schedule kind 'chimera'"), std::string::npos);
  }
  EXPECT_THROW(lower_communication(make_schedule("1f1b", 2, 2)), hp::Error);  // lowered twice
}
