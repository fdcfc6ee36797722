// `hp trace`'s reading, overlap figure and drawing of HP_TRACE's files, on hand-made spans
// whose answers are known: which engine time lies under compute that is not waiting.
#include <gtest/gtest.h>

#include <string>

#include "hp/base/error.h"
#include "hp/train/trace_svg.h"

using hp::train::TraceSpan;

namespace {

// Spans of rank 0 (ms): engine all-reduce [0, 10]; the caller's backward [0, 20] with a wait
// in [5, 8] and a synchronous collective in [9, 9.5].
const char* kTrace = R"json({"traceEvents": [
  {"name": "all_reduce (shared memory)", "cat": "comm", "ph": "X", "ts": 1000000, "dur": 10000, "pid": 0, "tid": 1},
  {"name": "backward", "cat": "compute", "ph": "X", "ts": 1000000, "dur": 20000, "pid": 0, "tid": 0},
  {"name": "wait all_reduce", "cat": "wait", "ph": "X", "ts": 1005000, "dur": 3000, "pid": 0, "tid": 0},
  {"name": "broadcast (gloo)", "cat": "comm", "ph": "X", "ts": 1009000, "dur": 500, "pid": 0, "tid": 0},
  {"name": "forward", "cat": "compute", "ph": "X", "ts": 1000000, "dur": 4000, "pid": 1, "tid": 0},
  {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}
]})json";

}  // namespace

TEST(TraceSvg, ReadsCompleteEvents) {
  const std::vector<TraceSpan> spans = hp::train::read_chrome_trace(kTrace);
  ASSERT_EQ(spans.size(), 5u);  // the metadata event is not a span
  EXPECT_EQ(spans[0].name, "all_reduce (shared memory)");
  EXPECT_EQ(spans[0].lane, 1);
  EXPECT_DOUBLE_EQ(spans[0].begin_ms, 1000);
  EXPECT_DOUBLE_EQ(spans[1].duration_ms, 20);
  EXPECT_THROW(hp::train::read_chrome_trace("{not json"), hp::Error);
}

TEST(TraceSvg, HiddenShareIsEngineTimeUnderComputeThatIsNotBlocked) {
  const auto overlap = hp::train::trace_overlap(hp::train::read_chrome_trace(kTrace));
  ASSERT_EQ(overlap.size(), 1u);  // rank 1 ran nothing on its engine
  EXPECT_EQ(overlap[0].rank, 0);
  EXPECT_DOUBLE_EQ(overlap[0].engine_ms, 10);
  EXPECT_DOUBLE_EQ(overlap[0].hidden_ms, 6.5);  // [0, 5] and [8, 9]: not [5, 8] waiting, not [9, 9.5] running a collective
  EXPECT_DOUBLE_EQ(overlap[0].wait_ms, 3);
}

TEST(TraceSvg, DrawsARowPerRankAndLaneWithinTheWindow) {
  const auto spans = hp::train::read_chrome_trace(kTrace);
  const std::string svg = hp::train::plot_trace_svg(spans);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("rank 0 caller"), std::string::npos);
  EXPECT_NE(svg.find("rank 0 engine"), std::string::npos);
  EXPECT_NE(svg.find("rank 1 caller"), std::string::npos);
  size_t rects = 0;
  for (size_t at = svg.find("<rect x="); at != std::string::npos; at = svg.find("<rect x=", at + 1)) ++rects;
  EXPECT_EQ(rects, 5u);
  // From 12 ms on, only rank 0's backward is left.
  const std::string late = hp::train::plot_trace_svg(spans, 12);
  EXPECT_EQ(late.find("rank 1 caller"), std::string::npos);
  EXPECT_NE(late.find("backward"), std::string::npos);
  EXPECT_THROW(hp::train::plot_trace_svg(spans, 30), hp::Error);
}
