// Regions inside checkpointed regions, and regions recomputed in token chunks: a Llama
// whose blocks are checkpointed and whose MLPs are regions of their own, recomputed chunk
// by chunk, against the same layout without checkpointing (float32: the chunks' weight
// gradients are summed in another order), on every rank; the inner forward runs only in its
// own backward where the enclosing recompute can stand in for it, and again in the
// enclosing recompute where something reads its output; clear errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/nn/moe.h"
#include "hp/tensor/fp8_linear.h"
#include "hp/tensor/memory_stats.h"
#include "memory/llama_checkpoint.h"

using namespace hp;
using hp::testing::Layout;
using hp::testing::LlamaRunSpec;

namespace {

// Blocks checkpointed (with `outer`), each block's `inner` module a region inside in `chunks`
// token chunks.
LlamaRunSpec chunked_llama(Layout layout, int chunks, const std::string& inner_pattern = "layers.*.mlp",
                           bool outer_region = true) {
  LlamaRunSpec spec = hp::testing::checkpointed_llama(layout, outer_region ? std::vector<std::string>{"layers.*"}
                                                                           : std::vector<std::string>{});
  CheckpointOptions inner;
  inner.token_chunks = chunks;
  auto outer = spec.parallelize;
  spec.parallelize = [outer, inner, inner_pattern](nn::Llama& model, const DeviceMesh& mesh) {
    checkpoint_wrapper(model, {inner_pattern}, inner);
    return outer(model, mesh);
  };
  return spec;
}

void expect_chunked_matches(Layout layout, int chunks) {
  const double before = memory::recompute_seconds();
  hp::testing::expect_runs_match(hp::testing::train_llama(chunked_llama(layout, chunks)),
                                 hp::testing::train_llama(hp::testing::checkpointed_llama(layout, {})), 1e-5, 1e-6);
  EXPECT_GT(memory::recompute_seconds(), before);
}

}  // namespace

// One process, 6 sequences of 8 tokens: 12 chunks split each sequence in two, 4 take whole ones.
TEST(NestedCheckpoint, ChunkedMlpSingleProcess) {
  expect_chunked_matches(Layout::Single, 12);
  expect_chunked_matches(Layout::Single, 4);
}
// Sequence parallel: the MLP's output is its input's sequences, half of each one's tokens
// (its reduce-scatter), so the chunks are whole sequences.
TEST(NestedCheckpoint, ChunkedMlpTp2) { expect_chunked_matches(Layout::Tp2, 5); }
TEST(NestedCheckpoint, ChunkedMlpFsdp3Uneven) { expect_chunked_matches(Layout::Fsdp3, 3); }
TEST(NestedCheckpoint, ChunkedMlpFsdp2Tp2) { expect_chunked_matches(Layout::Fsdp2Tp2, 4); }

// Attention reads every earlier token of its sequence (and rotary a token's position), so
// its region is recomputed in whole sequences, whatever token_chunks asks: 12 chunks of 6
// sequences would split each one in two.
TEST(NestedCheckpoint, ChunkedAttentionKeepsSequencesWhole) {
  for (Layout layout : {Layout::Single, Layout::Fsdp3}) {
    const double before = memory::recompute_seconds();
    hp::testing::expect_runs_match(hp::testing::train_llama(chunked_llama(layout, 12, "layers.*.attn", false)),
                                   hp::testing::train_llama(hp::testing::checkpointed_llama(layout, {})), 1e-5, 1e-6);
    EXPECT_GT(memory::recompute_seconds(), before);
  }
}

// Rotary alone ([batch, heads, tokens, head_dim]) turns each token by its position in the
// sequence: a chunk of a sequence's tokens would start again at position 0.
TEST(NestedCheckpoint, ChunkedRotaryKeepsSequencesWhole) {
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(6);
    DTensor x = randn({2, 2, 6, 8}, mesh, {Replicate()});
    const at::Tensor weights = at::randn({2, 2, 6, 8}, at::kDouble).to(x.to_local().scalar_type());
    auto grad = [&](int chunks) {
      x.requires_grad_();
      CheckpointOptions o;
      o.token_chunks = chunks;
      auto rotary = [](const DTensor& in) { return nn::apply_rotary(in, 10000.0); };
      DTensor y = chunks > 0 ? memory::checkpoint(rotary, x, {}, o) : rotary(x);
      (y.to_local() * weights).sum().backward();
      at::Tensor g = x.to_local().grad().clone();
      x.to_local().mutable_grad().reset();
      return g;
    };
    const at::Tensor want = grad(0), got = grad(6);  // 6 chunks would take 2 tokens of a sequence each
    EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-7)) << "max abs diff " << (got - want).abs().max().item<double>();
  });
}

// DistributedDataParallel over 2 ranks with gradient accumulation: in the second
// micro-step the gradients exist, and the recompute adds into them in place (its
// AccumulateGrad, and DDP's hook on it, run after the region's backward).
TEST(NestedCheckpoint, ChunkedMlpDdp2Accumulating) {
  auto ddp = [](bool checkpointed) {
    LlamaRunSpec spec;
    spec.mesh_shape = {2}, spec.batch = 8, spec.micro_steps = 2;
    spec.parallelize = [checkpointed](nn::Llama& model, const DeviceMesh& mesh) {
      if (checkpointed) {
        checkpoint_wrapper(model, {"layers.*"});
        CheckpointOptions inner;
        inner.token_chunks = 2;
        checkpoint_wrapper(model, {"layers.*.mlp"}, inner);
      }
      DDPOptions o;
      o.bucket_cap_mb = 0.001;  // a bucket per parameter or so: hooks fire one by one
      auto d = std::make_shared<DistributedDataParallel>(model, mesh["dp"], o);
      return std::function<void(bool)>([d](bool on) { d->set_requires_gradient_sync(on); });
    };
    return hp::testing::train_llama(spec);
  };
  hp::testing::expect_runs_match(ddp(true), ddp(false), 1e-5, 1e-6);
}

namespace {

// Linear, then tanh (then dropout), counting its forwards.
class Counted : public nn::Module {
 public:
  Counted(int64_t dim, const DeviceMesh& mesh, bool drops) : drops_(drops) {
    lin_ = register_module("lin", std::make_shared<nn::Linear>(dim, dim, mesh));
  }
  DTensor forward(const DTensor& x) override {
    ++calls;
    DTensor y = map((*lin_)(x), [](const at::Tensor& t) { return at::tanh(t); });
    return drops_ ? dropout(y, 0.3) : y;
  }
  int calls = 0;

 private:
  bool drops_;
  std::shared_ptr<nn::Linear> lin_;
};

// h = pre(x), then h + inner(h) (the residual shape of a block's MLP half: the add keeps
// no values), or inner(h) squared (the product reads the inner output); with dropouts,
// draws before, inside and after the inner region.
class Residual : public nn::Module {
 public:
  Residual(int64_t dim, const DeviceMesh& mesh, bool read, bool dropouts) : read_(read), dropouts_(dropouts) {
    pre = register_module("pre", std::make_shared<Counted>(dim, mesh, dropouts));
    inner = register_module("inner", std::make_shared<Counted>(dim, mesh, dropouts));
  }
  DTensor forward(const DTensor& x) override {
    DTensor h = (*pre)(x);
    DTensor y = (*inner)(h);
    DTensor skip = dropouts_ ? dropout(h, 0.3) : h;
    return read_ ? map(y, [](const at::Tensor& t) { return t * t; }) : add(skip, y);
  }
  std::shared_ptr<Counted> pre, inner;

 private:
  bool read_, dropouts_;
};

struct ResidualRun {
  std::vector<at::Tensor> grads;  // of x, pre's and inner's weights, per step
  std::vector<int> pre_calls, inner_calls;  // per step
};

// Two steps of the residual module on the same input, the inner region in `chunks` token
// chunks; 0: no checkpointing.
ResidualRun residual_run(bool read, bool dropouts, int chunks) {
  ResidualRun r;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(11);
    Residual m(8, mesh, read, dropouts);
    if (chunks > 0) {
      checkpoint_wrapper(m);
      CheckpointOptions inner;
      inner.token_chunks = chunks;
      checkpoint_wrapper(*m.inner, inner);
    }
    DTensor x = randn({2, 6, 8}, mesh, {Replicate()});
    x.requires_grad_();
    for (int step = 0; step < 2; ++step) {
      m.pre->calls = m.inner->calls = 0;
      m(x).to_local().sum().backward();
      r.pre_calls.push_back(m.pre->calls);
      r.inner_calls.push_back(m.inner->calls);
      for (DTensor* p : {&x, m.pre->parameters()[0], m.inner->parameters()[0]}) {
        r.grads.push_back(p->to_local().grad().clone());
        p->to_local().mutable_grad().reset();
      }
    }
  });
  return r;
}

void expect_same_grads(const ResidualRun& got, const ResidualRun& want, bool bitwise) {
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i)
    EXPECT_TRUE(bitwise ? at::equal(got.grads[i], want.grads[i])
                        : at::allclose(got.grads[i], want.grads[i], 1e-5, 1e-7))
        << "gradient " << i << ": max abs diff " << (got.grads[i] - want.grads[i]).abs().max().item<double>();
}

}  // namespace

// The enclosing recompute stands in for the inner region: its forward runs once in the
// forward and once per chunk in its own backward, never in the enclosing recompute.
TEST(NestedCheckpoint, InnerForwardRunsOnlyInItsOwnBackward) {
  const ResidualRun want = residual_run(false, false, 0), got = residual_run(false, false, 4);
  expect_same_grads(got, want, false);
  EXPECT_EQ(got.inner_calls, (std::vector<int>{1 + 4, 1 + 4}));  // 2 x 6 rows in 4 chunks of 3
  EXPECT_EQ(got.pre_calls, (std::vector<int>{2, 2}));  // forward, recompute
}

// Where a node that keeps values reads the inner output, the stand-in is found out: the
// enclosing recompute runs again with the inner forward, and from then on runs it at once.
TEST(NestedCheckpoint, ReadInnerOutputRunsInTheRecompute) {
  const ResidualRun want = residual_run(true, false, 0), got = residual_run(true, false, 2);
  expect_same_grads(got, want, false);
  EXPECT_EQ(got.pre_calls, (std::vector<int>{3, 2}));  // forward, the discarded recompute, the recompute
  EXPECT_EQ(got.inner_calls, (std::vector<int>{1 + 1 + 2, 1 + 1 + 2}));  // forward, recompute, 2 chunks
}

// A stand-in leaves the RNG where the inner forward left it, so the enclosing recompute's
// later draws repeat the forward's: the same masks, bitwise the same gradients.
TEST(NestedCheckpoint, StandInKeepsLaterDrawsInStep) {
  // The inner region whole (1 chunk): a chunked region may not draw, this one does.
  const ResidualRun want = residual_run(false, true, 0), got = residual_run(false, true, 1);
  expect_same_grads(got, want, true);
  EXPECT_EQ(got.inner_calls, (std::vector<int>{2, 2}));  // forward, its own backward
}

// A parameter whose gradient exists lends it to the recompute, which adds into it weight by
// weight: the region's weight gradients never all exist at once beside it.
TEST(NestedCheckpoint, RecomputeAddsIntoExistingGradients) {
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(2);
    const int64_t dim = 256;  // weights of 256 KiB against activations of 2 KiB
    nn::Linear a(dim, dim, mesh), b(dim, dim, mesh), c(dim, dim, mesh);
    DTensor x = randn({1, 2, dim}, mesh, {Replicate()});
    std::vector<DTensor*> params{a.parameters()[0], b.parameters()[0], c.parameters()[0]};
    auto step = [&] { return memory::checkpoint([&](const DTensor& in) { return c(b(a(in))); }, x, params); };
    step().to_local().sum().backward();  // the gradients now exist
    std::vector<at::Tensor> first;
    for (DTensor* p : params) first.push_back(p->to_local().grad().clone());
    track_cpu_memory();
    DTensor y = step();
    reset_cpu_memory_peak();
    const int64_t before = cpu_memory_allocated();
    y.to_local().sum().backward();
    const int64_t weight = dim * dim * 4;
    EXPECT_LT(cpu_memory_peak() - before, 2 * weight) << "the backward's peak held more than one weight gradient";
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(at::allclose(params[i]->to_local().grad(), 2 * first[i], 1e-6, 1e-7)) << "weight " << i;
  });
}

TEST(NestedCheckpoint, TokenChunksErrors) {
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(4);
    DTensor x = randn({2, 4, 8}, mesh, {Replicate()});
    x.requires_grad_();
    auto expect_error = [&](const std::function<DTensor(const DTensor&)>& fn, CheckpointOptions o,
                            const std::string& says) {
      try {
        memory::checkpoint(fn, x, {}, o).to_local().sum().backward();
        ADD_FAILURE() << "expected an error saying " << says;
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
    };
    CheckpointOptions chunks;
    chunks.token_chunks = 2;
    expect_error([](const DTensor& in) { return dropout(in, 0.5); }, chunks, "draws no random numbers");
    expect_error([](const DTensor& in) { return view(in, {2, 32}); }, chunks, "must have the same");
    expect_error([](const DTensor& in) { return add(in, mean(in, {0}, true)); }, chunks,
                 "mean(0)[keepdim] combines rows of different sequences");
    // Ops on local tensors are not seen: a MoE layer's token dispatch, or a plain flip of the batch.
    expect_error([](const DTensor& in) { return DTensor(in.to_local().flip(0), in.device_mesh(), in.spec()); },
                 chunks, "does not come from its input through hp's DTensor ops");
    nn::MoE moe(8, 16, nn::MoEOptions{}, mesh);
    expect_error([&](const DTensor& in) { return moe(in); }, chunks, "does not come from its input");
    // FP8's scales span rows (tensorwise here; the weight gradient's contraction in every mode).
    DTensor w = randn({8, 8}, mesh, {Replicate()});
    const Fp8Linear fp8;
    expect_error([&](const DTensor& in) { return fp8(in, w); }, chunks, "fp8_linear combines rows");
    CheckpointOptions selective = chunks;
    selective.policy = save_matmuls_and_collectives;
    expect_error([](const DTensor& in) { return in; }, selective, "selective policy");
    CheckpointOptions none;
    none.token_chunks = 0;
    expect_error([](const DTensor& in) { return in; }, none, "at least 1");
  });
}
