// DualPipeV on 2, 3, 4 and 8 ranks for microbatch counts from its minimum 2p up:
// the lists validate, sit on the V, hold each (stage, microbatch) once, follow the
// phase counts, and simulate (F = I = W = 1, B = 2) with less bubble than 1F1B.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <tuple>

#include "hp/base/error.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/lower.h"
#include "hp/schedule/simulate.h"
#include "hp/schedule/validate.h"

using namespace hp::schedule;

namespace {

struct Shape {
  int p, m;
};

// Every p under test with its smallest m, one more, and two longer runs.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int p : {2, 3, 4, 8})
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p + 3}) out.push_back({p, m});
  return out;
}

std::string where(const Shape& s) { return "p=" + std::to_string(s.p) + " m=" + std::to_string(s.m); }

double bubble(const std::string& kind, int p, int m) { return simulate(make_schedule(kind, p, m)).bubble_ratio; }

}  // namespace

TEST(DualPipeV, ValidatesAndLowers) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(where(sh));
    const Schedule s = lower_communication(dualpipev(sh.p, sh.m));
    EXPECT_TRUE(s.has_comm());
    EXPECT_NO_THROW(validate(s));
  }
}

TEST(DualPipeV, StagesSitOnTheV) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(where(sh));
    const Schedule s = make_schedule("dualpipev", sh.p, sh.m);
    EXPECT_EQ(s.num_stages, 2 * sh.p);
    EXPECT_EQ(s.stage_to_rank, v_stage_map(sh.p));
    for (int r = 0; r < sh.p; ++r) {
      EXPECT_EQ(s.stages_of(r), (std::vector<int>{r, 2 * sh.p - 1 - r}));
      for (const Action& a : s.actions[r])
        if (is_compute(a.type)) EXPECT_TRUE(a.stage == r || a.stage == 2 * sh.p - 1 - r) << to_string(a);
    }
    // The turn (stage p-1 to p) stays on rank p-1: nothing is sent across it.
    for (const auto& list : s.actions)
      for (const Action& a : list) EXPECT_FALSE(a.type == ActionType::SEND_F && a.stage == sh.p - 1);
  }
}

TEST(DualPipeV, OneForwardAndOneBackwardPerStageAndMicrobatch) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(where(sh));
    std::map<std::tuple<int, int, ActionType>, int> count;
    for (const auto& list : dualpipev(sh.p, sh.m).actions)
      for (const Action& a : list) ++count[{a.stage, a.microbatch, a.type}];
    for (int st = 0; st < 2 * sh.p; ++st)
      for (int mb = 0; mb < sh.m; ++mb) {
        auto n = [&](ActionType t) { return count[{st, mb, t}]; };
        EXPECT_EQ(n(ActionType::F), 1) << "F" << st << "." << mb;
        const bool whole = n(ActionType::B) == 1 && n(ActionType::I) == 0 && n(ActionType::W) == 0;
        const bool split = n(ActionType::B) == 0 && n(ActionType::I) == 1 && n(ActionType::W) == 1;
        EXPECT_TRUE(whole || split) << "backward of " << st << "." << mb;
      }
  }
}

// A forward immediately followed by a backward of the rank's other chunk is an
// overlapped pair: two per steady round (m - 2p + r + 1 rounds) and one per
// round of phase 5 (p - 1 - r rounds).
TEST(DualPipeV, OverlappedPairsFollowThePhaseCounts) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(where(sh));
    const Schedule s = dualpipev(sh.p, sh.m);
    for (int r = 0; r < sh.p; ++r) {
      const auto& list = s.actions[r];
      int pairs = 0;
      for (size_t i = 0; i + 1 < list.size(); ++i)
        pairs += list[i].type == ActionType::F && list[i + 1].type == ActionType::B &&
                 list[i].stage != list[i + 1].stage;
      EXPECT_EQ(pairs, 2 * (sh.m - 2 * sh.p + r + 1) + (sh.p - 1 - r)) << "rank " << r;
    }
  }
}

TEST(DualPipeV, OrderOnTwoRanks) {
  EXPECT_EQ(dualpipev(2, 4).to_string(false),
            "rank 0: F0.0 F0.1 F0.2 F3.0 I3.0 W3.0 F3.1 F0.3 B3.1 F3.2 B0.0 B3.2 F3.3 B0.1 B3.3 I0.2 W0.2 I0.3 W0.3\n"
            "rank 1: F1.0 F2.0 F1.1 F2.1 F1.2 B2.0 F2.2 B1.0 F1.3 B2.1 F2.3 B1.1 B2.2 B1.2 I2.3 I1.3 W2.3 W1.3\n");
}

// With F = I = W = 1 and B = 2 each rank idles p - 1 units in all (the V fills
// and drains once), and holds 2p + 1 half-size stage activations at its peak.
TEST(DualPipeV, MakespanAndPeakInFlight) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(where(sh));
    const SimResult sim = simulate(make_schedule("dualpipev", sh.p, sh.m));
    EXPECT_DOUBLE_EQ(sim.makespan, 6 * sh.m + sh.p - 1);
    for (int peak : sim.peak_in_flight) EXPECT_EQ(peak, 2 * sh.p + 1);
  }
}

TEST(DualPipeV, BubbleAgainstOneFOneBAndZbv) {
  std::printf("%3s %3s %9s %9s %9s\n", "p", "m", "1f1b", "zbv", "dualpipev");
  for (const Shape& sh : shapes()) {
    const double one = bubble("1f1b", sh.p, sh.m), zbv = bubble("zbv", sh.p, sh.m),
                 dual = bubble("dualpipev", sh.p, sh.m);
    std::printf("%3d %3d %9.4f %9.4f %9.4f\n", sh.p, sh.m, one, zbv, dual);
    EXPECT_LE(dual, one) << where(sh);
  }
}

TEST(DualPipeV, RejectsWhatItCannotRun) {
  auto message = [](int p, int m, int v = 0) {
    try {
      make_schedule("dualpipev", p, m, v);
    } catch (const hp::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(1, 4).find("needs at least 2 ranks, got 1"), std::string::npos);
  EXPECT_NE(message(4, 7).find("needs num_microbatches >= 2 * num_ranks = 8, got 7"), std::string::npos);
  EXPECT_NE(message(4, 8, 3).find("always has 2 stages per rank"), std::string::npos);
  EXPECT_EQ(message(4, 8, 2), "no error");
}
