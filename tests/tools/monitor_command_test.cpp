// `hp diff` and `hp monitor plot` from the command line: two monitor files, one perturbed
// from step 4, diverge at step 4 in the perturbed module (exit status 1); a file against
// itself does not (0); the plot is an SVG.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "hp/train/monitor_log.h"
#include "shell.h"

namespace {

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "hp_monitor_cmd_" + std::to_string(::getpid()) + "_" + name;
}

Result run_hp(const std::string& args) { return shell(HP_BIN_DIR "/hp " + args); }

// Steps 0..9, two modules each; from `perturbed_from` on the MLP's gradient norm is
// 1e-4 larger (relative).
void write_run(const std::string& path, int64_t perturbed_from = -1) {
  hp::train::MonitorWriter w(path, false);
  for (int64_t step = 0; step < 10; ++step) {
    for (const char* m : {"layers.0.attn.q_proj", "layers.0.mlp.down_proj"}) {
      hp::train::MonitorRecord r;
      r.step = step, r.module = m, r.act_norm = 3.0 + 0.25 * static_cast<double>(step), r.grad_norm = 0.125;
      if (perturbed_from >= 0 && step >= perturbed_from && r.module == "layers.0.mlp.down_proj")
        r.grad_norm *= 1 + 1e-4;
      w.write(r);
    }
    hp::train::MonitorRecord s;
    s.step = step, s.loss = 5.0, s.grad_norm = 1.0;
    w.write(s);
  }
}

}  // namespace

TEST(HpDiff, FindsTheStepAndModuleOfAnInjectedDivergence) {
  const std::string a = temp("a.jsonl"), b = temp("b.jsonl");
  write_run(a);
  write_run(b, /*perturbed_from=*/4);
  Result r = run_hp("diff " + a + " " + b);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("first divergence at step 4 in layers.0.mlp.down_proj: grad_norm 0.125 vs 0.1250125"),
            std::string::npos)
      << r.output;

  r = run_hp("diff " + a + " " + b + " --rtol 1e-3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("no divergence over 10 steps (30 lines) at rtol 0.001"), std::string::npos) << r.output;

  r = run_hp("diff " + a + " " + a);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("no divergence"), std::string::npos) << r.output;
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(HpMonitorPlot, WritesAnSvgOrASummary) {
  const std::string log = temp("run.jsonl"), svg = temp("run.svg");
  write_run(log);
  Result r = run_hp("monitor plot " + log + " --svg " + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  std::stringstream text;
  text << std::ifstream(svg).rdbuf();
  EXPECT_EQ(text.str().rfind("<svg", 0), 0u) << text.str().substr(0, 80);
  EXPECT_NE(text.str().find("layers.0.mlp.down_proj"), std::string::npos);

  r = run_hp("monitor plot " + log);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("10 steps monitored, 2 modules"), std::string::npos) << r.output;
  std::remove(log.c_str());
  std::remove(svg.c_str());
}
