// Activation checkpointing against the same run without it, on the same layout, seed and
// data: the loss of every step, every gradient of the first step and every parameter
// after 5 AdamW steps. The recompute runs the same kernels on the same numbers in the same
// order, so the runs must agree bitwise (at::equal), on every rank. Layouts: one process,
// tp=2 (sequence parallel, loss parallel), fully_shard over 3 ranks (uneven shards),
// fully_shard x tp on 2x2; regions: whole blocks, or attention and MLP separately.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/memory.h"
#include "hp/tensor/memory_stats.h"
#include "parallel/llama_run.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

enum class Layout { Single, Tp2, Fsdp3, Fsdp2Tp2 };

LlamaRunSpec spec_for(Layout layout, std::vector<std::string> checkpointed) {
  LlamaRunSpec spec;
  spec.batch = 6;  // rows split over 1, 2 or 3 dp ranks
  switch (layout) {
    case Layout::Single: break;
    case Layout::Tp2: spec.mesh_shape = {1, 2}, spec.mesh_names = {"dp", "tp"}; break;
    case Layout::Fsdp3: spec.mesh_shape = {3}; break;
    case Layout::Fsdp2Tp2: spec.mesh_shape = {2, 2}, spec.mesh_names = {"dp", "tp"}; break;
  }
  spec.parallelize = [layout, checkpointed](nn::Llama& model, const DeviceMesh& mesh) {
    std::function<void(bool)> sync;
    if (layout == Layout::Tp2 || layout == Layout::Fsdp2Tp2)
      parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, /*loss_parallel=*/true});
    if (!checkpointed.empty()) checkpoint_wrapper(model, checkpointed);
    if (layout == Layout::Fsdp3 || layout == Layout::Fsdp2Tp2) {
      FSDPModule root = fully_shard_llama(model, mesh["dp"]);
      sync = [root](bool on) mutable { root.set_requires_gradient_sync(on); };
    }
    return sync;
  };
  return spec;
}

void expect_identical(const LlamaRun& run, const LlamaRun& ref) {
  EXPECT_EQ(run.losses, ref.losses);
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // training happened
  for (auto which : {&LlamaRun::first_grads, &LlamaRun::final_params})
    for (auto& [name, t] : ref.*which) {
      ASSERT_TRUE((run.*which).count(name)) << name;
      EXPECT_TRUE(at::equal((run.*which).at(name), t))
          << name << ": max abs diff " << ((run.*which).at(name) - t).abs().max().item<double>();
    }
}

void expect_same_as_without(Layout layout, std::vector<std::string> checkpointed) {
  LlamaRun ref = hp::testing::train_llama(spec_for(layout, {}));
  expect_identical(hp::testing::train_llama(spec_for(layout, checkpointed)), ref);
}

const std::vector<std::string> kBlocks{"layers.*"};
const std::vector<std::string> kHalves{"layers.*.attn", "layers.*.mlp"};

}  // namespace

TEST(Checkpoint, SingleProcessBlocks) { expect_same_as_without(Layout::Single, kBlocks); }
TEST(Checkpoint, SingleProcessAttentionAndMlp) { expect_same_as_without(Layout::Single, kHalves); }
TEST(Checkpoint, Tp2Blocks) { expect_same_as_without(Layout::Tp2, kBlocks); }
TEST(Checkpoint, Fsdp3UnevenBlocks) { expect_same_as_without(Layout::Fsdp3, kBlocks); }
TEST(Checkpoint, Fsdp3UnevenAttentionAndMlp) { expect_same_as_without(Layout::Fsdp3, kHalves); }
TEST(Checkpoint, Fsdp2Tp2Blocks) { expect_same_as_without(Layout::Fsdp2Tp2, kBlocks); }

namespace {

// Linear, dropout, tanh: the mask comes from hp's RNG, so the recompute must replay it.
class DropoutBlock : public nn::Module {
 public:
  DropoutBlock(int64_t dim, const DeviceMesh& mesh) { lin_ = register_module("lin", std::make_shared<nn::Linear>(dim, dim, mesh)); }
  DTensor forward(const DTensor& x) override {
    return map(dropout((*lin_)(x), 0.5), [](const at::Tensor& t) { return at::tanh(t); });
  }

 private:
  std::shared_ptr<nn::Linear> lin_;
};

// Loss and gradients of two stacked blocks, the second checkpointed or not.
std::vector<at::Tensor> dropout_run(bool checkpointed, CheckpointOptions options = {}) {
  std::vector<at::Tensor> out;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(7);
    DropoutBlock a(8, mesh), b(8, mesh);
    if (checkpointed) checkpoint_wrapper(b, options);
    DTensor x = randn({4, 8}, mesh, {Replicate()});
    DTensor y = a(b(a(x)));  // draws after the region too: the replay must not shift them
    at::Tensor loss = y.to_local().pow(2).sum();
    loss.backward();
    out = {loss.detach(), a.parameters()[0]->to_local().grad(), b.parameters()[0]->to_local().grad()};
  });
  return out;
}

}  // namespace

TEST(Checkpoint, DropoutReplaysTheSameMask) {
  auto ref = dropout_run(false), got = dropout_run(true);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(at::equal(got[i], ref[i])) << "output " << i;
  // Without the replay the recompute draws a different mask: the gradients differ.
  CheckpointOptions no_replay;
  no_replay.preserve_rng_state = false;
  auto wrong = dropout_run(true, no_replay);
  EXPECT_TRUE(at::equal(wrong[0], ref[0]));
  EXPECT_FALSE(at::equal(wrong[2], ref[2]));
}

// What the checkpointing is for: the activations kept between forward and backward.
TEST(Checkpoint, KeepsOnlyTheBlockInputs) {
  auto kept_after_forward = [](bool checkpointed) {
    int64_t kept = 0;
    comm::run_local_ranks(1, [&](int) {
      DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
      manual_seed(3);
      nn::LlamaConfig c = hp::testing::tiny_llama();
      c.layers = 4, c.dim = 32, c.ffn_dim = 96, c.max_seq = 64;
      nn::Llama model(c, mesh);
      if (checkpointed) checkpoint_wrapper(model, {"layers.*"});
      DTensor ids = distribute_tensor((rand({4, 64}, at::kDouble) * c.vocab).floor().to(at::kLong), mesh, {Replicate()});
      track_cpu_memory();
      const int64_t before = cpu_memory_allocated();
      DTensor logits = model(ids);
      kept = cpu_memory_allocated() - before;
      logits.to_local().sum().backward();
    });
    return kept;
  };
  const int64_t full = kept_after_forward(false), ckpt = kept_after_forward(true);
  // Per block: about 20 saved tensors of [4, 64, 32..96] without, one input with.
  EXPECT_LT(ckpt * 4, full) << "kept " << ckpt << " bytes with checkpointing, " << full << " without";
}

TEST(Checkpoint, BadPatternsAndUnlistedTensorsAreErrors) {
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(1);
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    EXPECT_THROW(checkpoint_wrapper(model, {"layers.*.atn"}), hp::Error);   // matches nothing
    EXPECT_THROW(checkpoint_wrapper(model, {"layers.*", "layers.*.mlp"}), hp::Error);  // nested
    checkpoint_wrapper(model, {"layers.0"});
    EXPECT_THROW(checkpoint_wrapper(model, {"layers.0"}), hp::Error);  // twice

    // A region that reads a tensor needing a gradient it was not given.
    DTensor w = randn({4, 4}, mesh, {Replicate()});
    w.requires_grad_();
    DTensor x = randn({2, 4}, mesh, {Replicate()});
    x.requires_grad_();
    DTensor y = checkpoint([&](const DTensor& in) { return linear(in, w); }, x, {});
    try {
      y.to_local().sum().backward();
      ADD_FAILURE() << "expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("neither its input nor one of its parameters"), std::string::npos)
          << e.what();
    }
    // Listed, it works and matches the plain gradient.
    DTensor y2 = checkpoint([&](const DTensor& in) { return linear(in, w); }, x, {&w});
    y2.to_local().sum().backward();
    at::Tensor gw = w.to_local().grad().clone();
    w.to_local().mutable_grad().reset();
    linear(x, w).to_local().sum().backward();
    EXPECT_TRUE(at::equal(gw, w.to_local().grad()));
  });
}
