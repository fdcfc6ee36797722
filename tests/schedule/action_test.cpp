#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/schedule/action.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/io.h"

using namespace hp::schedule;

TEST(ScheduleAction, TextRoundTrips) {
  for (const char* text : {"F0.0", "B12.7", "I3.1", "W3.1", "SEND_F0.3>1", "RECV_F1.3<0",
                           "SEND_B4.2>3", "RECV_B3.2<4", "UNSHARD2", "RESHARD2"})
    EXPECT_EQ(to_string(parse_action(text)), text);
  EXPECT_EQ(parse_action("RECV_B3.2<4"), (Action{ActionType::RECV_B, 3, 2, 4}));
  for (const char* bad : {"", "X1.0", "F", "F1", "F1.", "SEND_F1.0", "F1.0>2", "F1.0x"})
    EXPECT_THROW(parse_action(bad), hp::Error) << bad;
}

TEST(ScheduleAction, MatchingCommIsAnInvolution) {
  const Action send{ActionType::SEND_F, 2, 5, 3};
  const Action recv = matching_comm(send, 2);
  EXPECT_EQ(recv, (Action{ActionType::RECV_F, 3, 5, 2}));
  EXPECT_EQ(matching_comm(recv, 3), send);
  EXPECT_EQ(matching_comm(Action{ActionType::SEND_B, 3, 1, 2}, 3),
            (Action{ActionType::RECV_B, 2, 1, 3}));
  EXPECT_THROW(matching_comm(compute(ActionType::F, 0, 0), 0), hp::Error);
}

TEST(ScheduleAction, StageMaps) {
  EXPECT_EQ(loop_stage_map(3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(loop_stage_map(2, 3), (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(v_stage_map(3), (std::vector<int>{0, 1, 2, 2, 1, 0}));
  EXPECT_THROW(loop_stage_map(0), hp::Error);
}

TEST(ScheduleAction, JsonRoundTrips) {
  const Schedule s = make_schedule("zbv", 2, 3);
  const Schedule back = schedule_from_json(to_json(s));
  EXPECT_EQ(back.name, s.name);
  EXPECT_EQ(back.stage_to_rank, s.stage_to_rank);
  EXPECT_EQ(back.num_microbatches, 3);
  EXPECT_EQ(back.actions, s.actions);
  EXPECT_THROW(schedule_from_json("{\"num_ranks\": 2}"), hp::Error);
}

TEST(ScheduleAction, PrintsOneLinePerRank) {
  const Schedule s = make_schedule("gpipe", 2, 2);
  EXPECT_EQ(s.to_string(false), "rank 0: F0.0 F0.1 B0.0 B0.1\nrank 1: F1.0 F1.1 B1.0 B1.1\n");
  EXPECT_NE(s.to_string(true).find("SEND_F0.0>1"), std::string::npos);
}
