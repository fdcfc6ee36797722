#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hp/schedule/generators.h"
#include "hp/schedule/render.h"
#include "hp/schedule/simulate.h"

using namespace hp::schedule;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(ScheduleRender, SvgHasABoxPerComputeAction) {
  const Schedule s = make_schedule("zb-h1", 2, 3);
  const std::string svg = render_svg(s, simulate(s));
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // 2 ranks * 3 microbatches * (F, I, W) boxes, each with a tooltip.
  EXPECT_EQ(count(svg, "<title>"), 18u);
  EXPECT_NE(svg.find(">I1.2</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<rect"), count(svg, "/>") - count(svg, "<line") + count(svg, "</rect>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
}

TEST(ScheduleRender, ChromeTraceParses) {
  const Schedule s = make_schedule("1f1b", 2, 2);
  const SimResult sim = simulate(s);
  const auto doc = nlohmann::json::parse(render_chrome_trace(s, sim, 1000));
  ASSERT_TRUE(doc.at("traceEvents").is_array());
  size_t complete = 0, actions = 0;
  for (const auto& list : s.actions) actions += list.size();
  double last_end = 0;
  for (const auto& ev : doc["traceEvents"]) {
    if (ev.at("ph") == "M") continue;
    ASSERT_EQ(ev.at("ph"), "X");
    ++complete;
    EXPECT_TRUE(ev.at("pid").is_number_integer());
    EXPECT_TRUE(ev.at("tid").is_number_integer());
    EXPECT_GE(ev.at("dur").get<double>(), 0);
    last_end = std::max(last_end, ev.at("ts").get<double>() + ev.at("dur").get<double>());
  }
  EXPECT_EQ(complete, actions);
  EXPECT_DOUBLE_EQ(last_end, sim.makespan * 1000);
  EXPECT_EQ(doc["otherData"]["schedule"], "1f1b");
}
