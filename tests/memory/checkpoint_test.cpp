// Activation checkpointing against the same run without it, on the same layout, seed and
// data: the loss of every step, every gradient of the first step and every parameter
// after 5 AdamW steps. The recompute runs the same kernels on the same numbers in the same
// order, so the runs must agree bitwise (at::equal), on every rank. Layouts: one process,
// tp=2 (sequence parallel, loss parallel), fully_shard over 3 ranks (uneven shards),
// fully_shard x tp on 2x2; regions: whole blocks, or attention and MLP separately.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/tensor/fused_cpu.h"
#include "hp/nn/moe.h"
#include "hp/tensor/memory_stats.h"
#include "memory/llama_checkpoint.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

using hp::testing::expect_same_as_without;
using hp::testing::Layout;

const std::vector<std::string> kBlocks{"layers.*"};
const std::vector<std::string> kHalves{"layers.*.attn", "layers.*.mlp"};

// The runs agree bitwise, and every rank's recompute left out `per_layer` products of each
// of the 2 layers in each of the 5 steps: those whose output meets only the residual add
// (a block's down projection; an attention or MLP region's last projection, its output).
void expect_same_leaving_out(Layout layout, const std::vector<std::string>& regions, int64_t per_layer) {
  const int64_t before = memory::products_left_out();
  expect_same_as_without(layout, regions);
  const int64_t ranks = layout == Layout::Single ? 1 : layout == Layout::Tp2 ? 2 : layout == Layout::Fsdp3 ? 3 : 4;
  EXPECT_EQ(memory::products_left_out() - before, ranks * 2 * 5 * per_layer);
}

}  // namespace

TEST(Checkpoint, SingleProcessBlocks) { expect_same_leaving_out(Layout::Single, kBlocks, 1); }
TEST(Checkpoint, SingleProcessAttentionAndMlp) { expect_same_leaving_out(Layout::Single, kHalves, 2); }
TEST(Checkpoint, Tp2Blocks) { expect_same_leaving_out(Layout::Tp2, kBlocks, 1); }
TEST(Checkpoint, Fsdp3UnevenBlocks) { expect_same_leaving_out(Layout::Fsdp3, kBlocks, 1); }
TEST(Checkpoint, Fsdp3UnevenAttentionAndMlp) { expect_same_leaving_out(Layout::Fsdp3, kHalves, 2); }
TEST(Checkpoint, Fsdp2Tp2Blocks) { expect_same_leaving_out(Layout::Fsdp2Tp2, kBlocks, 1); }

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
  const int64_t full = hp::testing::kept_after_forward({}), ckpt = hp::testing::kept_after_forward({"layers.*"});
  // Per block: about 20 saved tensors of [4, 64, 32..96] without, one input with.
  EXPECT_LT(ckpt * 4, full) << "kept " << ckpt << " bytes with checkpointing, " << full << " without";
}

// recompute_seconds() counts the recomputes, full and selective, and nothing else.
TEST(Checkpoint, CountsTheTimeSpentRecomputing) {
  double before = memory::recompute_seconds();
  hp::testing::kept_after_forward({});
  EXPECT_EQ(memory::recompute_seconds(), before) << "a run without checkpointing recomputed";
  hp::testing::kept_after_forward(kBlocks);
  EXPECT_GT(memory::recompute_seconds(), before) << "full checkpointing's recompute went uncounted";
  before = memory::recompute_seconds();
  CheckpointOptions selective;
  selective.policy = save_matmuls_and_collectives;
  hp::testing::kept_after_forward(kBlocks, selective);
  EXPECT_GT(memory::recompute_seconds(), before) << "selective checkpointing's replay went uncounted";
}

// A checkpointed MoE layer (full and selective): its recompute routes the same tokens
// without counting their expert loads again, and with the auxiliary loss carried on the
// layer's output (MoE::set_aux_loss_carry), the router's gradient is that of the layer run
// without checkpointing with the auxiliary loss added to the loss.
TEST(Checkpoint, MoERecomputeCountsLoadsOnceAndCarriesTheAuxiliaryLoss) {
  const int64_t tokens = 12;
  nn::MoEOptions o;
  o.num_experts = 4, o.top_k = 2, o.aux_loss_coef = 0.1;
  auto run = [&](std::optional<CheckpointOptions> checkpointed, at::Tensor* gate_grad, int64_t* kept = nullptr) {
    int64_t counted = 0;
    comm::run_local_ranks(1, [&](int) {
      DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
      manual_seed(5);
      nn::MoE moe(16, 8, o, mesh);
      if (checkpointed) moe.set_aux_loss_carry(1.0), checkpoint_wrapper(moe, *checkpointed);
      DTensor x = randn({tokens, 16}, mesh, {Replicate()});
      x.requires_grad_();
      track_cpu_memory();
      const int64_t before = cpu_memory_allocated();
      DTensor y = moe(x);
      if (kept) *kept = cpu_memory_allocated() - before;
      at::Tensor loss = y.to_local().pow(2).sum();
      if (!checkpointed) loss = loss + moe.aux_loss()->to_local();
      loss.backward();
      *gate_grad = moe.router().parameters()[0]->to_local().grad().clone();
      counted = moe.router().take_tokens_per_expert().sum().item<int64_t>();
    });
    return counted;
  };
  at::Tensor want, got;
  int64_t kept_none = 0, kept = 0;
  EXPECT_EQ(run(std::nullopt, &want, &kept_none), tokens * o.top_k);
  CheckpointOptions selective;
  selective.policy = save_matmuls_and_collectives;
  for (const CheckpointOptions& c : {CheckpointOptions(), selective}) {
    const std::string mode = c.policy ? "selective" : "full";
    const double before = memory::recompute_seconds();
    EXPECT_EQ(run(c, &got, &kept), tokens * o.top_k) << mode << ": the recompute counted its tokens again";
    // Full keeps the input and the output (964 of 8,612 bytes here); selective keeps what
    // the routing, the dispatch and the experts' kernels save, which are not observed ops.
    if (!c.policy) EXPECT_LT(kept * 4, kept_none) << "full kept " << kept << " bytes, none " << kept_none;
    EXPECT_GT(memory::recompute_seconds(), before) << mode;
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-7))
        << mode << ": the router's gradient differs by " << (got - want).abs().max().item<double>();
  }
}

// The recompute's graph runs once and nothing outside holds its tensors, so a recomputed
// SwiGLU writes its input gradients over its inputs: the region's backward then needs less
// than where something else holds a recomputed input.
TEST(Checkpoint, RecomputedSwiGLUWritesItsGradientsOverItsInputs) {
  track_cpu_memory();
  auto backward = [](bool hold) {
    at::manual_seed(3);
    at::Tensor x = at::randn({64, 256}).requires_grad_();
    std::vector<at::Tensor> held;
    at::Tensor y = memory::checkpoint(
        [&](const at::Tensor& in) {
          at::Tensor gate = in * 2, up = in * 3;
          if (hold) held.push_back(gate);
          return fused::swiglu(gate, up);
        },
        x, {});
    reset_cpu_memory_peak();
    const int64_t before = cpu_memory_allocated();
    y.sum().backward();
    return std::pair{cpu_memory_peak() - before, x.grad()};
  };
  const auto [held_bytes, held_grad] = backward(true);
  const auto [bytes, grad] = backward(false);
  EXPECT_TRUE(at::equal(grad, held_grad));
  EXPECT_LE(bytes + 64 * 256 * 4, held_bytes) << bytes << " B against " << held_bytes << " B";
}

// A second backward through a region whose first freed its graph is a clear error, not a
// crash; with retain_graph it runs again, to the same gradient.
TEST(Checkpoint, ASecondBackwardNeedsTheGraphRetained) {
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    DTensor w = randn({4, 4}, mesh, {Replicate()});
    w.requires_grad_();
    DTensor x = randn({2, 4}, mesh, {Replicate()});
    DTensor y = memory::checkpoint([&](const DTensor& in) { return linear(in, w); }, x, {&w});
    y.to_local().sum().backward();
    try {
      y.to_local().sum().backward();
      ADD_FAILURE() << "expected an error";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
    }
    w.to_local().mutable_grad().reset();
    DTensor z = memory::checkpoint([&](const DTensor& in) { return linear(in, w); }, x, {&w});
    z.to_local().sum().backward({}, /*retain_graph=*/true);
    const at::Tensor once = w.to_local().grad().clone();
    z.to_local().sum().backward();
    EXPECT_TRUE(at::equal(w.to_local().grad(), 2 * once));
  });
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
    DTensor y = memory::checkpoint([&](const DTensor& in) { return linear(in, w); }, x, {});
    try {
      y.to_local().sum().backward();
      ADD_FAILURE() << "expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("neither its input nor one of its parameters"), std::string::npos)
          << e.what();
    }
    // Listed, it works and matches the plain gradient.
    DTensor y2 = memory::checkpoint([&](const DTensor& in) { return linear(in, w); }, x, {&w});
    y2.to_local().sum().backward();
    at::Tensor gw = w.to_local().grad().clone();
    w.to_local().mutable_grad().reset();
    linear(x, w).to_local().sum().backward();
    EXPECT_TRUE(at::equal(gw, w.to_local().grad()));
  });
}
