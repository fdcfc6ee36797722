// Tensor (and data) parallel Llama against the single-process model on the same numbers:
// loss every step, every gradient after the first step, every parameter after 5 AdamW
// steps. float32; tolerance: relative 1e-5 with an absolute floor of 1e-6 for values
// near zero.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "parallel/llama_run.h"

using namespace hp;

namespace {

using hp::testing::LlamaRun;

const LlamaRun& reference(bool tied = false) {
  static std::map<bool, LlamaRun> cache;
  if (!cache.count(tied)) {
    hp::testing::LlamaRunSpec spec;
    spec.tied = tied;
    cache[tied] = hp::testing::train_llama(spec);
  }
  return cache[tied];
}

void expect_matches_reference(int64_t dp, int64_t tp, bool sp, bool tied = false) {
  hp::testing::LlamaRunSpec spec;
  spec.mesh_shape = {dp, tp}, spec.mesh_names = {"dp", "tp"}, spec.tied = tied;
  spec.parallelize = [tp, sp](nn::Llama& model, const DeviceMesh& mesh) {
    if (tp > 1) parallelize_llama(model, mesh["tp"], {sp, /*loss_parallel=*/true});
    return std::function<void(bool)>();
  };
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), reference(tied));
}

}  // namespace

TEST(TensorParallel, Tp2) { expect_matches_reference(1, 2, false); }
TEST(TensorParallel, Tp4) { expect_matches_reference(1, 4, false); }
TEST(TensorParallel, Tp2SequenceParallel) { expect_matches_reference(1, 2, true); }
TEST(TensorParallel, Tp4SequenceParallel) { expect_matches_reference(1, 4, true); }
TEST(TensorParallel, Dp4) { expect_matches_reference(4, 1, false); }
TEST(TensorParallel, Dp2Tp2) { expect_matches_reference(2, 2, false); }
TEST(TensorParallel, Dp2Tp2SequenceParallel) { expect_matches_reference(2, 2, true); }
TEST(TensorParallel, Tp2TiedEmbeddings) { expect_matches_reference(1, 2, false, true); }

TEST(TensorParallel, ParametersAreShardedAndPatternsChecked) {
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {1, 2}, {"dp", "tp"});
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    parallelize_llama(model, mesh["tp"]);
    for (auto& [name, p] : model.named_parameters()) {
      if (name.find("q_proj") != std::string::npos) {
        EXPECT_EQ(p->placements()[1], Shard(0)) << name;
        EXPECT_EQ(p->to_local().size(0) * 2, p->size(0)) << name;  // half the rows each
      }
      if (name.find("o_proj") != std::string::npos) EXPECT_EQ(p->placements()[1], Shard(1)) << name;
      if (name.find("norm") != std::string::npos) EXPECT_EQ(p->placements()[1], Replicate()) << name;
    }
    EXPECT_THROW(parallelize_module(model, mesh["tp"], {{"layers.*.atn.q_proj", ColwiseParallel()}}), hp::Error);
    EXPECT_TRUE(name_matches("layers.*.attn.q_proj", "layers.3.attn.q_proj"));
    EXPECT_FALSE(name_matches("layers.*.attn", "layers.3.attn.q_proj"));
  });
}
