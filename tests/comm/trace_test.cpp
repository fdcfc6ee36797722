// HP_TRACE's recording (hp/comm/trace.h), ranks as threads: every collective leaves one span
// per rank, on the engine's lane when it ran there (asynchronous) and on the caller's when
// it ran there (synchronous), named by op and transport; the Chrome JSON holds them all.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <map>

#include "hp/comm.h"

using namespace hp;
using namespace hp::comm;

TEST(Trace, CollectivesLeaveASpanPerRankOnTheirLane) {
  trace::set_enabled(true);
  trace::clear();
  run_local_ranks(2, [](int rank) {
    const Group& g = *current_world()->world_group();
    at::Tensor a = at::ones({1000}), b = at::ones({1000});
    Pending pa = all_reduce_async(a, g), pb = all_reduce_async(b, g);
    pb.wait();
    pa.wait();
    all_reduce(a, g);
    trace::Span("compute", "step");
  });
  trace::set_enabled(false);
  const std::vector<trace::Event> events = trace::events();
  std::map<std::pair<int, int>, int> all_reduces;  // (rank, lane)
  std::map<int, int> steps;
  for (const trace::Event& e : events) {
    EXPECT_GE(e.duration_us, 0);
    if (e.name == "all_reduce (shared memory)") ++all_reduces[{e.rank, e.lane}];
    if (e.name == "step") ++steps[e.rank];
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((all_reduces[{r, trace::kEngine}]), 2) << "rank " << r;
    EXPECT_EQ((all_reduces[{r, trace::kCaller}]), 1) << "rank " << r;
    EXPECT_EQ(steps[r], 1) << "rank " << r;
  }
  const nlohmann::json j = nlohmann::json::parse(trace::to_chrome_json(events));
  size_t spans = 0;
  for (const auto& e : j["traceEvents"]) spans += e["ph"] == "X";
  EXPECT_EQ(spans, events.size());
  trace::clear();
}

TEST(Trace, OffRecordsNothing) {
  trace::clear();
  run_local_ranks(2, [](int) {
    at::Tensor a = at::ones({10});
    all_reduce(a, *current_world()->world_group());
  });
  EXPECT_TRUE(trace::events().empty());
}
