#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/plan/model_desc.h"
#include "hp/plan/pipeline_profile.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/schedule/generators.h"

using namespace hp::plan;

// The estimator's bubble and in-flight counts are the schedule simulator's, on the
// schedules the trainer runs (make_schedule) with chunk_costs: checked here against a
// direct simulation, and against hand counts where the closed forms were right.
namespace {

double simulated_bubble(const std::string& kind, int p, int m, int v, double recompute_share) {
  hp::schedule::CostModel costs;
  costs.uniform = chunk_costs(recompute_share);
  return hp::schedule::simulate(hp::schedule::make_schedule(kind, p, m, v), costs).bubble_ratio;
}

}  // namespace

TEST(PipelineBubble, IsTheSimulatedSchedules) {
  struct Case {
    const char* kind;
    int p, m, v;
    double hand;  // by hand where it is known, else < 0
  };
  for (const Case& c : {Case{"gpipe", 4, 8, 1, 3.0 / 11},        // (p-1)/(m+p-1)
                        Case{"1f1b", 4, 8, 1, 3.0 / 11},         // (p-1)/(m+p-1)
                        Case{"interleaved-1f1b", 4, 8, 2, 3.0 / 19},  // (p-1)/(vm+p-1)
                        Case{"zb-h1", 4, 8, 1, 1.0 / 9},         // not (p-1)/(3(m+p-1)) = 0.091
                        Case{"zbv", 4, 8, 2, 1.0 / 17},          // not (p-1)/(6(m+p-1)) = 0.045
                        Case{"dualpipev", 4, 8, 2, -1}, Case{"zb-h1", 8, 32, 1, -1}, Case{"zbv", 8, 32, 2, -1}}) {
    const PipelineShape shape{c.kind, c.p, c.m, c.v};
    for (double r : {0.0, 0.03, 1.0})
      EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(shape, r), simulated_bubble(c.kind, c.p, c.m, c.v, r))
          << c.kind << " p=" << c.p << " m=" << c.m << " r=" << r;
    if (c.hand >= 0) EXPECT_NEAR(pipeline_bubble_fraction(shape, 0), c.hand, 1e-12) << c.kind;
  }
  EXPECT_NEAR(pipeline_bubble_fraction({"zb-h1", 4, 8, 1}, 0), 0.111, 5e-4);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction({"1f1b", 1, 8, 1}, 0), 0.0);
  EXPECT_THROW(pipeline_bubble_fraction({"wavy", 4, 8, 1}, 0), hp::Error);
  // More microbatches, smaller bubble; recompute lengthens the split backward's input half.
  EXPECT_LT(pipeline_bubble_fraction({"1f1b", 8, 64, 1}, 0), pipeline_bubble_fraction({"1f1b", 8, 16, 1}, 0));
  EXPECT_GT(pipeline_bubble_fraction({"zb-h1", 4, 8, 1}, 1), pipeline_bubble_fraction({"zb-h1", 4, 8, 1}, 0));
}

TEST(PipelineBubble, ChunkCostsSplitTheBackward) {
  const hp::schedule::StageCost c = chunk_costs(1);  // full recompute: one more forward
  EXPECT_EQ(c.f, 1);
  EXPECT_EQ(c.i, 2);
  EXPECT_EQ(c.w, 1);
  EXPECT_EQ(c.b, 3);
}

TEST(PipelineStages, BalancedSplitLightensTheChunkWithTheHead) {
  // 80 layers of about 1.85 GFLOP/token; the head (2.1) rides on the last chunk. The even
  // split 14,14,13,13,13,13 would make the last chunk the slowest (13 layers + head).
  ModelDesc m = model_preset("llama3-70b");
  auto st = split_stages(m, 6, 1, "1f1b");
  ASSERT_EQ(st.size(), 6u);
  std::vector<int64_t> layers;
  for (const auto& s : st) layers.push_back(s.layers());
  EXPECT_EQ(layers, (std::vector<int64_t>{14, 14, 14, 13, 13, 12}));
  EXPECT_TRUE(st[0].embedding);
  EXPECT_TRUE(st[5].head);
}

TEST(PipelineStages, InterleavedAndVPlacement) {
  ModelDesc m = model_preset("tiny");  // 4 layers
  auto inter = split_stages(m, 2, 2, "interleaved-1f1b");
  EXPECT_EQ(inter[0].chunks, 2);
  EXPECT_TRUE(inter[0].embedding);
  EXPECT_TRUE(inter[1].head);  // chunk 3 -> rank 1
  for (const char* schedule : {"zbv", "dualpipev"}) {
    auto v = split_stages(m, 2, 2, schedule);
    EXPECT_TRUE(v[0].embedding);
    EXPECT_TRUE(v[0].head) << schedule;  // the V comes back to rank 0
    EXPECT_FALSE(v[1].head);
  }
}

TEST(PipelineStages, MoeLayersCounted) {
  ModelDesc m = model_preset("deepseek-v3-like");  // 3 dense + 58 MoE
  auto st = split_stages(m, 4, 1, "1f1b");
  EXPECT_EQ(st[0].dense_layers, 3);
  EXPECT_EQ(st[0].moe_layers, 13);
  EXPECT_EQ(st[3].dense_layers, 0);
}

TEST(PipelineStages, InflightMicrobatches) {
  using V = std::vector<double>;
  EXPECT_EQ(inflight_microbatches({"1f1b", 1, 16, 1}), V{1});
  EXPECT_EQ(inflight_microbatches({"gpipe", 4, 16, 1}), (V{16, 16, 16, 16}));
  EXPECT_EQ(inflight_microbatches({"1f1b", 4, 16, 1}), (V{4, 3, 2, 1}));
  EXPECT_EQ(inflight_microbatches({"1f1b", 4, 2, 1}), (V{2, 2, 2, 1}));
  // ZB-H1 rank r defers r weight grads, whose inputs stay alive: p everywhere, not p - r.
  EXPECT_EQ(inflight_microbatches({"zb-h1", 4, 16, 1}), (V{4, 4, 4, 4}));
  // interleaved, p=4, v=2: 2(p-r-1) + p + 1 chunks, e.g. 11 on rank 0 = 5.5 microbatches of its layers.
  EXPECT_EQ(inflight_microbatches({"interleaved-1f1b", 4, 16, 2}), (V{5.5, 4.5, 3.5, 2.5}));
  EXPECT_EQ(inflight_microbatches({"zbv", 4, 16, 2}), (V{4, 4, 4, 4}));
  EXPECT_EQ(inflight_microbatches({"dualpipev", 4, 8, 2}), (V{4.5, 4.5, 4.5, 4.5}));
}

TEST(PipelineProfiles, CachesEachShapeAndCostOnce) {
  PipelineProfiles cache;
  // Every key field matters: a cache that ignored one would answer the first of a pair twice.
  const std::vector<PipelineShape> shapes = {{"zb-h1", 4, 8, 1},  {"zb-h1", 4, 16, 1}, {"zb-h1", 8, 16, 1},
                                             {"1f1b", 4, 8, 1},   {"interleaved-1f1b", 4, 8, 2},
                                             {"interleaved-1f1b", 4, 8, 4}};
  for (int round = 0; round < 2; ++round)
    for (const PipelineShape& s : shapes) {
      for (double r : {0.0, 1.0})
        EXPECT_DOUBLE_EQ(cache.bubble_fraction(s, r), pipeline_bubble_fraction(s, r)) << s.schedule << " r=" << r;
      EXPECT_EQ(cache.inflight(s), inflight_microbatches(s)) << s.schedule;
    }
  EXPECT_EQ(cache.computed(), shapes.size() * 3);  // two bubbles and one in-flight list each, once
}
