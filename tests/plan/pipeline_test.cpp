#include <gtest/gtest.h>

#include <vector>

#include "hp/base/error.h"
#include "hp/plan/model_desc.h"
#include "hp/plan/pipeline_bubble.h"
#include "hp/plan/pipeline_stages.h"

using namespace hp::plan;

TEST(PipelineBubble, ClosedForms) {
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction("1f1b", 1, 8, 1), 0.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction("gpipe", 4, 8, 1), 3.0 / 11);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction("1f1b", 4, 8, 1), 3.0 / 11);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction("interleaved-1f1b", 4, 8, 2), 3.0 / 19);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction("zb-h1", 4, 8, 1), 3.0 / 33);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction("zbv", 4, 8, 2), 3.0 / 66);
  EXPECT_THROW(pipeline_bubble_fraction("wavy", 4, 8, 1), hp::Error);
  // More microbatches, smaller bubble.
  EXPECT_LT(pipeline_bubble_fraction("1f1b", 8, 64, 1), pipeline_bubble_fraction("1f1b", 8, 16, 1));
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
  auto v = split_stages(m, 2, 2, "zbv");
  EXPECT_TRUE(v[0].embedding);
  EXPECT_TRUE(v[0].head);  // the V comes back to rank 0
  EXPECT_FALSE(v[1].head);
}

TEST(PipelineStages, MoeLayersCounted) {
  ModelDesc m = model_preset("deepseek-v3-like");  // 3 dense + 58 MoE
  auto st = split_stages(m, 4, 1, "1f1b");
  EXPECT_EQ(st[0].dense_layers, 3);
  EXPECT_EQ(st[0].moe_layers, 13);
  EXPECT_EQ(st[3].dense_layers, 0);
}

TEST(PipelineStages, InflightMicrobatches) {
  EXPECT_EQ(inflight_microbatches("1f1b", 1, 16, 1, 0), 1);
  EXPECT_EQ(inflight_microbatches("gpipe", 4, 16, 1, 0), 16);
  EXPECT_EQ(inflight_microbatches("1f1b", 4, 16, 1, 0), 4);
  EXPECT_EQ(inflight_microbatches("1f1b", 4, 16, 1, 3), 1);
  EXPECT_EQ(inflight_microbatches("1f1b", 4, 2, 1, 0), 2);
  // interleaved, p=4, v=2: 2*3 + 4 + 1 = 11 chunks on rank 0 = 5.5 microbatches of the rank's layers.
  EXPECT_DOUBLE_EQ(inflight_microbatches("interleaved-1f1b", 4, 16, 2, 0), 5.5);
  EXPECT_EQ(inflight_microbatches("zbv", 4, 16, 2, 3), 4);
}
