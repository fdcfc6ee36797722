#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "hp/base/error.h"
#include "hp/plan/search.h"

using namespace hp::plan;

namespace {

void expect_valid_sorted_fitting(const SearchResult& r, const ModelDesc& m, int64_t devices, double usable) {
  for (size_t i = 0; i < r.best.size(); ++i) {
    const Estimate& e = r.best[i];
    EXPECT_NO_THROW(resolve_strategy(e.strategy, m, devices)) << to_string(e.strategy);
    EXPECT_EQ(e.strategy.devices(), devices);
    EXPECT_TRUE(e.fits);
    EXPECT_LE(e.memory.total(), usable);
    if (i) EXPECT_LE(r.best[i - 1].time.total, e.time.total);
  }
}

}  // namespace

TEST(Search, TinyOnOneServer) {
  Estimator est(model_preset("tiny"), load_cluster("server-8"));
  SearchOptions o;
  o.global_batch = 64;
  o.top = 5;
  SearchResult r = search(est, o);
  ASSERT_EQ(r.best.size(), 5u);
  EXPECT_GT(r.fitting, 5);
  expect_valid_sorted_fitting(r, est.model(), 8, est.usable_memory());
}

TEST(Search, EightBillionOnOneServer) {
  Estimator est(model_preset("llama3-8b"), load_cluster("server-8"));
  SearchOptions o;
  o.global_batch = 32;
  SearchResult r = search(est, o);
  ASSERT_FALSE(r.best.empty());
  EXPECT_LT(r.fitting, r.candidates);  // some do not fit
  expect_valid_sorted_fitting(r, est.model(), 8, est.usable_memory());
}

TEST(Search, TriesEverySchedule) {
  Estimator est(model_preset("tiny"), load_cluster("server-8"));
  for (const std::string& schedule : schedule_names()) {
    SearchOptions o;
    o.global_batch = 64;
    o.top = 1000;
    o.schedules = {schedule};
    bool pipelined = false;
    for (const Estimate& e : search(est, o).best) pipelined |= e.strategy.pp > 1 && e.strategy.schedule == schedule;
    EXPECT_TRUE(pipelined) << schedule;
  }
}

TEST(Search, NothingFitsIsAnEmptyAnswer) {
  Estimator est(model_preset("llama3-405b"), load_cluster("server-8"));
  SearchResult r = search(est, SearchOptions{});
  EXPECT_TRUE(r.best.empty());
  EXPECT_EQ(r.fitting, 0);
}

TEST(Search, RejectsMoreDevicesThanTheTopology) {
  Estimator est(model_preset("tiny"), load_cluster("server-8"));
  SearchOptions o;
  o.devices = 16;
  EXPECT_THROW(search(est, o), hp::Error);
}

TEST(Search, SixteenThousandDevices) {
  Estimator est(model_preset("llama3-70b"), load_cluster("cluster-16k"));
  SearchOptions o;
  o.devices = 16384;
  SearchResult r = search(est, o);
  std::cout << "llama3-70b on 16384 devices: " << r.meshes << " meshes, " << r.candidates << " strategies, "
            << r.fitting << " fit, searched in " << r.seconds << " s\n";
  ASSERT_EQ(r.best.size(), 10u);
  expect_valid_sorted_fitting(r, est.model(), 16384, est.usable_memory());
}
