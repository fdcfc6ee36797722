#include <gtest/gtest.h>

#include <sstream>

#include "hp/base/error.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/validate.h"

using namespace hp::schedule;

namespace {

// A loop-mapped schedule written by hand, one string of actions per rank.
Schedule by_hand(int m, const std::vector<std::string>& ranks) {
  Schedule s;
  s.name = "hand";
  s.num_ranks = static_cast<int>(ranks.size());
  s.num_stages = s.num_ranks;
  s.num_microbatches = m;
  s.stage_to_rank = loop_stage_map(s.num_ranks);
  for (const std::string& line : ranks) {
    s.actions.emplace_back();
    std::istringstream in(line);
    for (std::string a; in >> a;) s.actions.back().push_back(parse_action(a));
  }
  return s;
}

// The message validate() throws, or "" when it accepts.
std::string rejection(const Schedule& s, int send_capacity = kUnboundedSends) {
  try {
    validate(s, send_capacity);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REJECTED(s, fragment)                                              \
  do {                                                                            \
    const std::string msg = rejection(s);                                         \
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message was: " << msg; \
  } while (0)

const std::string kRank0 = "F0.0 SEND_F0.0>1 F0.1 SEND_F0.1>1 RECV_B0.0<1 B0.0 RECV_B0.1<1 B0.1";
const std::string kRank1 = "RECV_F1.0<0 F1.0 B1.0 SEND_B1.0>0 RECV_F1.1<0 F1.1 B1.1 SEND_B1.1>0";

}  // namespace

TEST(ScheduleValidate, AcceptsAHandWrittenSchedule) {
  EXPECT_EQ(rejection(by_hand(2, {kRank0, kRank1})), "");
}

TEST(ScheduleValidate, MissingRecv) {
  EXPECT_REJECTED(by_hand(2, {kRank0, "F1.0 B1.0 SEND_B1.0>0 RECV_F1.1<0 F1.1 B1.1 SEND_B1.1>0"}),
                  "rank 0 position 1 (SEND_F0.0>1): no matching RECV_F1.0<0 on rank 1");
}

TEST(ScheduleValidate, MissingSend) {
  EXPECT_REJECTED(by_hand(2, {"F0.0 F0.1 SEND_F0.1>1 RECV_B0.0<1 B0.0 RECV_B0.1<1 B0.1", kRank1}),
                  "rank 1 position 0 (RECV_F1.0<0): no matching SEND_F0.0>1 on rank 0");
}

TEST(ScheduleValidate, UnloweredScheduleLacksTransfers) {
  EXPECT_REJECTED(one_f_one_b(2, 2),
                  "rank 0 position 2 (B0.0): needs RECV_B0.0<1 on rank 0 before it, found none");
}

TEST(ScheduleValidate, SwappedReceivesDeadlock) {
  // Rank 1 waits for microbatch 1 first; rank 0 only sends it after the
  // backward of microbatch 0, which rank 1 has not started.
  const Schedule s = by_hand(2, {
      "F0.0 SEND_F0.0>1 RECV_B0.0<1 B0.0 F0.1 SEND_F0.1>1 RECV_B0.1<1 B0.1",
      "RECV_F1.1<0 F1.1 B1.1 SEND_B1.1>0 RECV_F1.0<0 F1.0 B1.0 SEND_B1.0>0"});
  const std::string msg = rejection(s);
  EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 position 2: RECV_B0.0<1 waits for SEND_B1.0>0 on rank 1"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 position 0: RECV_F1.1<0 waits for SEND_F0.1>1 on rank 0"),
            std::string::npos) << msg;
}

TEST(ScheduleValidate, DuplicateForward) {
  EXPECT_REJECTED(by_hand(2, {"F0.0 " + kRank0, kRank1}),
                  "rank 0 position 1 (F0.0): duplicate of position 0");
}

TEST(ScheduleValidate, MissingBackward) {
  EXPECT_REJECTED(by_hand(2, {kRank0, "RECV_F1.0<0 F1.0 B1.0 SEND_B1.0>0 RECV_F1.1<0 F1.1"}),
                  "stage 1 microbatch 1 on rank 1: no B (or I + W)");
}

TEST(ScheduleValidate, ActionOnTheWrongRank) {
  EXPECT_REJECTED(by_hand(2, {"F1.0 " + kRank0, kRank1}),
                  "rank 0 position 0 (F1.0): stage 1 lives on rank 1");
}

TEST(ScheduleValidate, SendBeforeItsCompute) {
  EXPECT_REJECTED(
      by_hand(2, {"SEND_F0.0>1 F0.0 F0.1 SEND_F0.1>1 RECV_B0.0<1 B0.0 RECV_B0.1<1 B0.1", kRank1}),
      "rank 0 position 0 (SEND_F0.0>1): needs F0.0 on rank 0 before it, found it at position 1");
}

TEST(ScheduleValidate, BackwardBeforeItsGradArrives) {
  EXPECT_REJECTED(
      by_hand(2, {"F0.0 SEND_F0.0>1 F0.1 SEND_F0.1>1 B0.0 RECV_B0.0<1 RECV_B0.1<1 B0.1", kRank1}),
      "rank 0 position 4 (B0.0): needs RECV_B0.0<1 on rank 0 before it");
}

TEST(ScheduleValidate, WeightGradBeforeInputGrad) {
  Schedule s = by_hand(1, {"F0.0 W0.0 I0.0"});
  EXPECT_REJECTED(s, "rank 0 position 1 (W0.0): needs I0.0 on rank 0 before it");
  EXPECT_REJECTED(by_hand(1, {"F0.0 I0.0"}), "I without W");
  EXPECT_REJECTED(by_hand(1, {"F0.0 B0.0 I0.0 W0.0"}), "both B and I");
}

TEST(ScheduleValidate, WrongPeerAndSelfTransfer) {
  EXPECT_REJECTED(by_hand(1, {"F0.0 B0.0 SEND_F0.0>0"}), "there is no stage 1");
  Schedule v;
  v.name = "v";
  v.num_ranks = 2;
  v.num_stages = 4;
  v.num_microbatches = 1;
  v.stage_to_rank = v_stage_map(2);
  v.actions = {{compute(ActionType::F, 0, 0)}, {{ActionType::SEND_F, 1, 0, 1}}};
  // On the V, stages 1 and 2 share rank 1: nothing to send.
  EXPECT_REJECTED(v, "rank 1 position 0 (SEND_F1.0>1): stages on the same rank exchange nothing");
  v.actions[1][0].peer = 0;
  EXPECT_REJECTED(v, "stage 2 lives on rank 1, not on peer 0");
}

TEST(ScheduleValidate, RendezvousSendsDeadlockNaive1F1B) {
  // The lowering assumes isend: with rendezvous sends, rank 0's SEND_F of the
  // next microbatch and rank 1's SEND_B of the first wait on each other.
  const Schedule s = make_schedule("1f1b", 2, 3);
  EXPECT_EQ(rejection(s), "");
  const std::string msg = rejection(s, 0);
  EXPECT_NE(msg.find("rendezvous"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 position 3: SEND_F0.1>1 waits for rank 1 to receive"),
            std::string::npos) << msg;
  EXPECT_EQ(rejection(s, 1), "");
  EXPECT_EQ(rejection(make_schedule("gpipe", 4, 5), 0), "");
}
