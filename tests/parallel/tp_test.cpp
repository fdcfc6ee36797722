// Tensor (and data) parallel Llama against the single-process model on the same numbers:
// loss every step, every gradient after the first step, every parameter after 5 AdamW
// steps. float32; tolerance: relative 1e-5 with an absolute floor of 1e-6 for values
// near zero.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "hp/optim/adamw.h"
#include "hp/parallel.h"

using namespace hp;

namespace {

struct Run {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> first_grads, final_params;
};

nn::LlamaConfig tiny() {
  nn::LlamaConfig c;
  c.vocab = 32, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 24, c.max_seq = 8;
  return c;
}

constexpr int64_t kBatch = 4, kSeq = 8, kSteps = 5;

// Trains on `mesh_shape` (dp, tp); rank 0's view of the results.
Run train(int64_t dp, int64_t tp, bool sequence_parallel, bool tied = false) {
  Run out;
  std::mutex mu;
  comm::run_local_ranks(static_cast<int>(dp * tp), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {dp, tp}, {"dp", "tp"});
    manual_seed(1234);
    nn::LlamaConfig c = tiny();
    c.tied_embeddings = tied;
    nn::Llama model(c, mesh);
    if (tp > 1) parallelize_llama(model, mesh["tp"], {sequence_parallel, /*loss_parallel=*/true});
    optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
    Run mine;
    for (int64_t step = 0; step < kSteps; ++step) {
      at::Tensor tokens = (hp::rand({kBatch, kSeq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
      std::vector<Placement> rows{Shard(0), Replicate()};
      DTensor ids = distribute_tensor(tokens.narrow(1, 0, kSeq).contiguous(), mesh, rows);
      DTensor targets = distribute_tensor(tokens.narrow(1, 1, kSeq).contiguous(), mesh, rows);
      DTensor loss = model.loss(ids, targets);
      loss.to_local().backward();
      mine.losses.push_back(loss.full_tensor().item<double>());
      if (step == 0)
        for (auto& [name, p] : model.named_parameters()) mine.first_grads[name] = p->grad()->full_tensor();
      opt.step();
      opt.zero_grad();
    }
    for (auto& [name, p] : model.named_parameters()) mine.final_params[name] = p->full_tensor();
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = mine;
    }
  });
  return out;
}

const Run& reference(bool tied = false) {
  static std::map<bool, Run> cache;
  if (!cache.count(tied)) cache[tied] = train(1, 1, false, tied);
  return cache[tied];
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6))
      << what << ": max abs diff " << (got - want).abs().max().item<double>();
}

void expect_matches_reference(int64_t dp, int64_t tp, bool sp, bool tied = false) {
  const Run& ref = reference(tied);
  Run run = train(dp, tp, sp, tied);
  ASSERT_EQ(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "loss at step " << i;
  // The loss must fall, or the comparison would prove little.
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  for (auto& [name, g] : ref.first_grads) expect_close(run.first_grads.at(name), g, "gradient of " + name);
  for (auto& [name, p] : ref.final_params) expect_close(run.final_params.at(name), p, "parameter " + name);
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
    nn::Llama model(tiny(), mesh);
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
