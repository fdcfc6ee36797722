// Plan -> train: the config `hp plan --emit-config` writes for the fastest strategy the
// trainer runs (on 4 devices of a small cluster), and the ones `hp dryrun --emit-config`
// writes for a pipeline strategy and for selective and chunked full recompute, each
// trained for 3 steps under hprun; all start from the same initial loss as every other
// layout of the same model and seed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "shell.h"

namespace {

std::string temp(const std::string& name) {
  return ::testing::TempDir() + "hp_plan_to_train_" + std::to_string(::getpid()) + "_" + name;
}

const std::string kModel = std::string(PROJECT_DIR) + "/configs/bench_3m_desc.toml";

// Three steps of the emitted config (smaller sequences: the planner's are the model's 256)
// on its ranks; returns the first step's loss as printed.
std::string train_briefly(const std::string& config) {
  Result ranks = shell("sed -n 's/.*on \\([0-9]*\\) ranks.*/\\1/p' " + config + ".out");
  const std::string nproc = ranks.output.substr(0, ranks.output.find('\n'));
  EXPECT_FALSE(nproc.empty()) << "no rank count in the emit message";
  Result edit = shell("sed -i 's/^steps = .*/steps = 3/; s/^log_every = .*/log_every = 1/; s/^seq = .*/seq = 64/' " +
                      config);
  EXPECT_EQ(edit.code, 0) << edit.output;
  Result run = shell("OMP_NUM_THREADS=1 " HP_BIN_DIR "/hprun --nproc-per-node " + nproc + " " HP_BIN_DIR
                     "/hp train --config " + config);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("done: loss"), std::string::npos) << run.output;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(run.output, m, std::regex("step +0 +loss +([0-9.]+)"))) << run.output;
  return m.size() > 1 ? m[1].str() : "";
}

}  // namespace

TEST(PlanToTrain, EmittedConfigsRun) {
  const std::string planned = temp("plan.toml"), pipelined = temp("pp.toml"), recomputed = temp("rc.toml");
  Result plan = shell(HP_BIN_DIR "/hp plan --model " + kModel +
                      " --topology server-8 --devices 4 --global-batch 8 --top 3 --emit-config " + planned +
                      " > " + planned + ".out");
  ASSERT_EQ(plan.code, 0) << plan.output;
  Result dry = shell(HP_BIN_DIR "/hp dryrun --model " + kModel +
                     " --topology server-8 --devices 4 --strategy pp=2,dp=2,mb=4,schedule=1f1b --emit-config " +
                     pipelined + " > " + pipelined + ".out");
  ASSERT_EQ(dry.code, 0) << dry.output;
  Result rc = shell(HP_BIN_DIR "/hp dryrun --model " + kModel +
                    " --topology server-8 --devices 4 --strategy dp=2,tp=2,gbs=8,recompute=selective --emit-config " +
                    recomputed + " > " + recomputed + ".out");
  ASSERT_EQ(rc.code, 0) << rc.output;
  Result keys = shell("grep -c '^activation_checkpoint = \"selective\"' " + recomputed);
  EXPECT_EQ(keys.output, "1\n") << "the strategy's recompute reaches the trainer's [memory] section";
  const std::string chunked = temp("chunked.toml");
  Result ch = shell(HP_BIN_DIR "/hp dryrun --model " + kModel +
                    " --topology server-8 --devices 4 --strategy dp=4,gbs=8,recompute=full_chunked --emit-config " +
                    chunked + " > " + chunked + ".out");
  ASSERT_EQ(ch.code, 0) << ch.output;
  Result chunk_keys = shell("grep -c '^chunked_modules = \\[\"layers.\\*.mlp\"\\]\\|^activation_checkpoint = \"full\"' " +
                            chunked);
  EXPECT_EQ(chunk_keys.output, "2\n") << "full_chunked reaches the trainer as full with chunked MLPs";
  const std::string a = train_briefly(planned), b = train_briefly(pipelined), c = train_briefly(recomputed),
                    d = train_briefly(chunked);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "the same model, seed and data start at the same loss whatever the layout";
  EXPECT_EQ(a, c) << "recompute does not change the loss";
  EXPECT_EQ(a, d) << "nor does recompute with chunked MLPs";
  for (const auto& f : {planned, pipelined, recomputed, chunked})
    std::remove(f.c_str()), std::remove((f + ".out").c_str());
}

TEST(PlanToTrain, WhatTheTrainerDoesNotRunIsNamed) {
  Result r = shell(HP_BIN_DIR "/hp dryrun --model " + kModel +
                   " --topology server-8 --devices 4 --strategy pp=2,dp=2,mb=4,schedule=zb-h1,recompute=full "
                   "--emit-config " + temp("x.toml"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("splits the backward, which a fully recomputed region cannot"), std::string::npos)
      << r.output;
}
