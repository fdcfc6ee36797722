// `hp plot` from the command line: a metrics file becomes an SVG or a summary; a bad file
// fails with its line number.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "hp/train/metrics.h"
#include "shell.h"

namespace {

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "hp_plot_" + std::to_string(::getpid()) + "_" + name;
}

Result hp_plot(const std::string& args) { return shell(HP_BIN_DIR "/hp plot " + args); }

void write_run(const std::string& path) {
  hp::train::MetricsWriter w(path, false);
  for (int64_t step = 10; step <= 50; step += 10) {
    hp::train::MetricsRecord r;
    r.step = step;
    r.loss = 6.0 - static_cast<double>(step) / 10;
    r.tokens_per_s = 10000;
    w.write(r);
  }
}

}  // namespace

TEST(HpPlot, WritesAnSvg) {
  const std::string metrics = temp("run.jsonl"), svg = temp("run.svg");
  write_run(metrics);
  Result r = hp_plot(metrics + " --svg " + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + svg + " (5 steps)"), std::string::npos) << r.output;
  std::stringstream text;
  text << std::ifstream(svg).rdbuf();
  EXPECT_EQ(text.str().rfind("<svg", 0), 0u) << text.str().substr(0, 80);
  EXPECT_NE(text.str().find("</svg>"), std::string::npos);
  std::remove(metrics.c_str());
  std::remove(svg.c_str());
}

TEST(HpPlot, WithoutSvgPrintsASummary) {
  const std::string metrics = temp("summary.jsonl");
  write_run(metrics);
  Result r = hp_plot(metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("5 steps logged, 10 to 50"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("loss 5.0000 -> 1.0000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mean 10000 tokens/s"), std::string::npos) << r.output;
  std::remove(metrics.c_str());
}

TEST(HpPlot, ABadFileFailsWithItsLine) {
  const std::string metrics = temp("bad.jsonl");
  std::ofstream(metrics) << "{\"step\": 1}\n{\"step\": 2,\n";
  Result r = hp_plot(metrics + " --svg " + temp("bad.svg"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("hp: error: " + metrics + " line 2:"), std::string::npos) << r.output;
  std::remove(metrics.c_str());
}
