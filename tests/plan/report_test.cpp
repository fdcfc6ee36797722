#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hp/plan/report.h"

using namespace hp::plan;

TEST(Report, DryrunTextAndJson) {
  ModelDesc m = model_preset("llama3-70b");
  ClusterSpec c = load_cluster("superpod-384");
  Estimate e = estimate(m, c, parse_strategy("dp=8,tp=8,pp=6,mb=16,fsdp=1,recompute=full,schedule=1f1b"));
  std::string text = format_dryrun(e, m, c);
  for (const char* want : {"memory per rank", "fits", "tp all_gather", "superpod", "pipeline bubble", "MFU"})
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  auto j = nlohmann::json::parse(dryrun_json(e, m, c));
  EXPECT_EQ(j["devices"], 384);
  EXPECT_EQ(j["estimate"]["dims"]["pp"], 6);
  EXPECT_NEAR(j["estimate"]["time_seconds"]["total"].get<double>(), e.time.total, 1e-12);
  EXPECT_TRUE(j["estimate"]["comm_bytes_per_rank_by_level"].contains("server"));
}

TEST(Report, PlanTextAndJson) {
  ModelDesc m = model_preset("tiny");
  ClusterSpec c = load_cluster("server-8");
  Estimator est(m, c);
  SearchOptions o;
  o.global_batch = 32;
  o.top = 3;
  SearchResult r = search(est, o);
  std::string text = format_plan(r, m, c, 8);
  EXPECT_NE(text.find("best: "), std::string::npos) << text;
  auto j = nlohmann::json::parse(plan_json(r, m, c, 8));
  EXPECT_EQ(j["best"].size(), 3u);
}
