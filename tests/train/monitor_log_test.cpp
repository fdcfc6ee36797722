// The precision monitor's torch-free parts: the spike detector against a running median,
// the log's round trip, where two logs first diverge, and a well-formed plot.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "hp/base/error.h"
#include "hp/train/monitor_log.h"
#include "hp/train/monitor_svg.h"
#include "hp/train/spike_detector.h"

using hp::train::MonitorRecord;

namespace {

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "hp_monitor_log_" + std::to_string(::getpid()) + "_" + name;
}

// Steps 0, 2, ..., 18 of a run: two modules and the step's line each; from `perturbed_from`
// on, the second module's activation norm is off by `by` (relative).
std::vector<MonitorRecord> run(int64_t perturbed_from = -1, double by = 0) {
  std::vector<MonitorRecord> out;
  for (int64_t step = 0; step < 20; step += 2) {
    for (const char* m : {"tok_embeddings", "layers.0.attn.q_proj"}) {
      MonitorRecord r;
      r.step = step, r.module = m;
      r.act_norm = 10.0 + static_cast<double>(step) / 3;
      r.grad_norm = 1e-3 / (1 + static_cast<double>(step));
      if (perturbed_from >= 0 && step >= perturbed_from && r.module == "layers.0.attn.q_proj") r.act_norm *= 1 + by;
      out.push_back(r);
    }
    MonitorRecord s;
    s.step = step, s.loss = 5.5 - 0.1 * static_cast<double>(step), s.grad_norm = 0.7;
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(SpikeDetector, FlagsAValueAboveFactorTimesTheRunningMedian) {
  hp::train::SpikeDetector d(3.0, /*window=*/20, /*min_history=*/5);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(d.observe(100.0 * (i + 1))) << "no baseline yet";  // 100..400
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(d.observe(2.0 + 0.01 * i)) << i;
  // The window now holds only the last 20 values, 2.00..2.19: median 2.095.
  auto spike = d.observe(7.0);
  ASSERT_TRUE(spike);
  EXPECT_NEAR(*spike, 2.095, 1e-12);
  EXPECT_FALSE(d.observe(6.0));  // 6.0 < 3 x 2.1
  EXPECT_FALSE(d.observe(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(d.observe(std::numeric_limits<double>::infinity()));
}

TEST(MonitorLog, RoundTripsEveryKindOfLine) {
  const std::string path = temp("round_trip.jsonl");
  std::vector<MonitorRecord> written = run();
  MonitorRecord spike;
  spike.step = 7, spike.event = "loss_spike", spike.value = 9.5, spike.median = 2.25;
  written.push_back(spike);
  MonitorRecord bad;
  bad.step = 8, bad.module = "norm", bad.act_norm = std::numeric_limits<double>::infinity(), bad.grad_norm = 1;
  written.push_back(bad);
  {
    hp::train::MonitorWriter w(path, false);
    for (const auto& r : written) w.write(r);
  }
  EXPECT_EQ(hp::train::to_json_line(written[0]),
            R"({"step":0,"module":"tok_embeddings","act_norm":10.0,"grad_norm":0.001})");
  EXPECT_EQ(hp::train::to_json_line(spike), R"({"step":7,"event":"loss_spike","value":9.5,"median":2.25})");
  const auto read = hp::train::read_monitor_log(path);
  ASSERT_EQ(read.size(), written.size());
  for (size_t i = 0; i + 1 < read.size(); ++i) {
    EXPECT_EQ(read[i].step, written[i].step) << i;
    EXPECT_EQ(read[i].module, written[i].module) << i;
    EXPECT_EQ(read[i].event, written[i].event) << i;
    EXPECT_EQ(read[i].loss, written[i].loss) << i;
    EXPECT_EQ(read[i].act_norm, written[i].act_norm) << i;
    EXPECT_EQ(read[i].grad_norm, written[i].grad_norm) << i;
    EXPECT_EQ(read[i].value, written[i].value) << i;
    EXPECT_EQ(read[i].median, written[i].median) << i;
  }
  EXPECT_TRUE(std::isnan(read.back().act_norm));  // written as null
  std::remove(path.c_str());
}

TEST(MonitorLog, ABadLineNamesFileAndLine) {
  const std::string path = temp("bad.jsonl");
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"step\":0,\"loss\":1}\n{\"module\":\"x\"}\n", f);
  std::fclose(f);
  try {
    hp::train::read_monitor_log(path);
    ADD_FAILURE() << "expected an error";
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + " line 2: needs an integer \"step\""), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(MonitorLog, FindsTheFirstStepAndModuleThatDiverge) {
  const auto a = run(), b = run(/*perturbed_from=*/4, /*by=*/1e-3);
  const auto same = hp::train::compare_monitor_logs(a, a, 1e-5);
  EXPECT_FALSE(same.first);
  EXPECT_EQ(same.steps_compared, 10);
  EXPECT_EQ(same.lines_compared, 30);

  const auto c = hp::train::compare_monitor_logs(a, b, 1e-5);
  ASSERT_TRUE(c.first);
  EXPECT_EQ(c.first->step, 4);
  EXPECT_EQ(c.first->module, "layers.0.attn.q_proj");
  EXPECT_EQ(c.first->metric, "act_norm");
  EXPECT_FALSE(hp::train::compare_monitor_logs(a, b, 1e-2).first) << "within a looser tolerance";

  // A resumed run logs steps again: the last line of each (step, module) is the one compared.
  auto resumed = run();
  for (const MonitorRecord& r : run(/*perturbed_from=*/0, /*by=*/0.5))
    if (r.step <= 2) resumed.insert(resumed.begin(), r);  // stale lines first
  EXPECT_FALSE(hp::train::compare_monitor_logs(a, resumed, 1e-5).first);
}

TEST(MonitorLog, SvgHasThreePanelsAndALineForEachModule) {
  const std::string svg = hp::train::plot_monitor_svg(run());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  EXPECT_EQ(polylines, 1u + 2 * 2);  // the loss, then act and grad norms of two modules
  for (const char* text : {">loss<", ">activation norm (log10)<", ">output gradient norm (log10)<",
                           ">layers.0.attn.q_proj<", "</svg>"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_THROW(hp::train::plot_monitor_svg({}), hp::Error);
}
