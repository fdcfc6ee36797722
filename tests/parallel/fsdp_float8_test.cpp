// fully_shard's FP8 all-gather (enable_fsdp_float8_all_gather) on the tiny Llama against
// the single-process FP8 run (tensorwise, no fully_shard): losses, first gradients and
// parameters after 5 AdamW steps within float32 tolerance (relative 1e-5), at dp 2, dp 3
// (uneven shards), HSDP 2x2 and dp 2 x tp 2, and delayed scaling over 2 steps (as in
// low_precision_test.cpp). The gathered weight is the product's own deq(q(W)) bit for bit,
// so only float32 summation order differs. Then what the gathers move, counted from the
// collective log, against the bf16 gathers of the same model.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <map>

#include "hp/nn/layers.h"
#include "hp/tensor/fp8_linear.h"
#include "parallel/llama_run.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

LowPrecisionConfig tensorwise(bool delayed = false, bool fsdp_float8_all_gather = false) {
  LowPrecisionConfig c;
  c.delayed = delayed;
  c.enable_fsdp_float8_all_gather = fsdp_float8_all_gather;
  return c;
}

LlamaRunSpec base_spec(bool delayed, int64_t batch) {
  LlamaRunSpec spec;
  spec.batch = batch;
  if (delayed) spec.steps = 2;
  return spec;
}

// The single-process FP8 run.
const LlamaRun& reference(bool delayed = false, int64_t batch = 4) {
  static std::map<std::pair<bool, int64_t>, LlamaRun> cache;
  auto key = std::make_pair(delayed, batch);
  if (!cache.count(key)) {
    LlamaRunSpec spec = base_spec(delayed, batch);
    spec.parallelize = [delayed](nn::Llama& model, const DeviceMesh&) {
      apply_low_precision(model, tensorwise(delayed));
      return std::function<void(bool)>();
    };
    cache[key] = hp::testing::train_llama(spec);
  }
  return cache[key];
}

// FP8 Linears whose weights fully_shard gathers in FP8. `hsdp`: the first two mesh dims are
// (dp_rep, dp_shard); `fp8_after_fsdp`: apply_low_precision after fully_shard.
LlamaRunSpec float8_gather_spec(std::vector<int64_t> shape, std::vector<std::string> names, bool delayed = false,
                                int64_t batch = 4, bool fp8_after_fsdp = false, bool fsdp_float8_all_gather = true) {
  LlamaRunSpec spec = base_spec(delayed, batch);
  spec.mesh_shape = shape;
  spec.mesh_names = names;
  spec.parallelize = [=](nn::Llama& model, const DeviceMesh& mesh) {
    if (names.back() == "tp") parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/false, true});
    const LowPrecisionConfig config = tensorwise(delayed, fsdp_float8_all_gather);
    if (!fp8_after_fsdp) apply_low_precision(model, config);
    FSDPModule root =
        fully_shard_llama(model, names[0] == "dp_rep" ? mesh[{"dp_rep", "dp_shard"}] : mesh["dp"]);
    if (fp8_after_fsdp) apply_low_precision(model, config);
    return std::function<void(bool)>([root](bool on) mutable { root.set_requires_gradient_sync(on); });
  };
  return spec;
}

std::vector<const Fp8Linear*> fp8_layers(nn::Llama& model) {
  std::vector<const Fp8Linear*> layers;
  for (auto& [name, m] : model.named_modules())
    if (auto* lin = dynamic_cast<nn::Linear*>(m))
      if (auto* f = lin->product().target<Fp8Linear>()) layers.push_back(f);
  return layers;
}

}  // namespace

TEST(FsdpFloat8AllGather, Dp2) {
  hp::testing::expect_runs_match(hp::testing::train_llama(float8_gather_spec({2}, {"dp"})), reference());
}
// 3 ranks split dims of 16, 24 and 8 unevenly (2 batch rows each); FP8 applied after
// fully_shard. Also bitwise equal to the same layout gathering float32 weights: the product
// sees the same deq(q(W)).
TEST(FsdpFloat8AllGather, Dp3UnevenAppliedAfterFullyShard) {
  const LlamaRun run =
      hp::testing::train_llama(float8_gather_spec({3}, {"dp"}, false, /*batch=*/6, /*fp8_after_fsdp=*/true));
  hp::testing::expect_runs_match(run, reference(false, 6));
  SCOPED_TRACE("against float32 gathers");
  const LlamaRunSpec float32_gathers = float8_gather_spec({3}, {"dp"}, false, 6, true, /*fsdp_float8_all_gather=*/false);
  hp::testing::expect_runs_match(run, hp::testing::train_llama(float32_gathers), /*rtol=*/0, /*atol=*/0);
}
TEST(FsdpFloat8AllGather, Hsdp2x2) {
  hp::testing::expect_runs_match(hp::testing::train_llama(float8_gather_spec({2, 2}, {"dp_rep", "dp_shard"})),
                                 reference());
}
TEST(FsdpFloat8AllGather, Dp2Tp2) {
  hp::testing::expect_runs_match(hp::testing::train_llama(float8_gather_spec({2, 2}, {"dp", "tp"})), reference());
}
// The unit records each weight's amax in the layer's history once per forward, and the
// layer, given the cast weight, records none: one entry per step, as without fully_shard.
TEST(FsdpFloat8AllGather, Dp2Delayed) {
  LlamaRunSpec spec = float8_gather_spec({2}, {"dp"}, /*delayed=*/true);
  spec.after_backward = [](nn::Llama& model, int64_t step) {
    const auto layers = fp8_layers(model);
    ASSERT_EQ(layers.size(), 14u);
    for (const Fp8Linear* f : layers) EXPECT_EQ(f->histories().weight->recorded(), step + 1) << "step " << step;
  };
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), reference(/*delayed=*/true));
}

// Given a weight over the storage fully_shard says holds the cast weight, the product takes
// it as is. W = [1, 1.01]: quantized with its amax 1.01, 1 lands on 448 / 448 * 1.01 = 1.01.
TEST(FsdpFloat8AllGather, ProductTakesTheCastWeightAsIs) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    Fp8LinearOptions o;
    o.enable_fsdp_float8_all_gather = true;
    Fp8Linear f(o);
    DTensor x = distribute_tensor(at::tensor({1.0f, 0.0f}).view({1, 2}), mesh, {Replicate()});
    at::Tensor w = at::tensor({1.0f, 1.01f}).view({1, 2});
    const DTensor weight = distribute_tensor(w, mesh, {Replicate()});
    EXPECT_FLOAT_EQ(f(x, weight).to_local().item<float>(), 1.01f);  // quantized here
    f.precast_weight().storage = weight.to_local().storage();
    f.precast_weight().scale = at::ones({});  // as if cast at scale 1: q(1.01) = 1
    EXPECT_EQ(f(x, weight).to_local().item<float>(), 1.0f);  // taken as cast, not quantized again
    EXPECT_FLOAT_EQ(f(x, distribute_tensor(w.clone(), mesh, {Replicate()})).to_local().item<float>(), 1.01f);
  });
}

TEST(FsdpFloat8AllGather, OtherScalingsAreRefused) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    for (const char* scaling : {"rowwise", "mx_block"}) {
      LowPrecisionConfig c = tensorwise(false, true);
      c.scaling = scaling;
      try {
        apply_low_precision(model, c);
        ADD_FAILURE() << scaling << " was accepted";
      } catch (const hp::Error& e) {
        EXPECT_NE(std::string(e.what()).find("FP8 all-gather in fully_shard needs tensorwise scaling, not " +
                                             std::string(scaling)),
                  std::string::npos)
            << e.what();
      }
    }
  });
}

// One step at dp 2, every all-gather and all-reduce fully_shard issues. The root unit
// (embedding, final norm, float32 head) is gathered first and once; the blocks twice each
// (forward and backward). A block's segment: its 7 FP8 weights at 1 byte an element, its 2
// norms in float32; bf16 moves 2 bytes for each. Each block's forward gather is preceded by
// one max all-reduce of its 7 amaxes; its backward gather reuses them.
TEST(FsdpFloat8AllGather, MovesAboutHalfTheBytesOfBf16) {
  struct Gathers {
    int64_t root = 0, blocks = 0;
    int amax_reductions = 0;
  };
  auto one_step = [](bool fp8) {
    Gathers g;
    comm::run_local_ranks(2, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {2}, {"dp"});
      manual_seed(1);
      nn::Llama model(hp::testing::tiny_llama(), mesh);
      FullyShardOptions o;
      if (fp8)
        apply_low_precision(model, tensorwise(false, true));
      else
        o.mp_policy.param_dtype = at::kBFloat16;
      fully_shard_llama(model, mesh, o);
      const at::Tensor tokens = (hp::rand({4, 9}, at::kDouble) * 32).floor().to(at::kLong);
      DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, {Shard(0)});
      DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, {Shard(0)});
      auto& log = comm::current_world()->collective_log();
      log.clear();
      log.enable();
      model.loss(ids, targets).to_local().backward();
      log.enable(false);
      Gathers mine;
      bool first = true;
      for (const auto& r : log.records()) {
        if (r.op == "all_reduce" && r.numel == 7) ++mine.amax_reductions;
        if (r.op != "all_gather") continue;
        (first ? mine.root : mine.blocks) += r.bytes();
        if (fp8) EXPECT_EQ(r.dtype, first ? at::kFloat : at::kByte) << r.to_string();
        first = false;
      }
      if (rank == 0) g = mine;
    });
    return g;
  };
  const Gathers fp8 = one_step(true), bf16 = one_step(false);
  // Per rank and block: 1920 weight elements in 7 slots of 128, 64, 64, 128, 192, 192, 192
  // bytes, and 2 norms of 8 float32 (32 bytes each); bf16: 2 bytes for each of 1952.
  EXPECT_EQ(fp8.blocks, 2 * 2 * (960 + 64));
  EXPECT_EQ(bf16.blocks, 2 * 2 * (976 * 2));
  EXPECT_EQ(fp8.amax_reductions, 2);
  EXPECT_EQ(bf16.amax_reductions, 0);
  const double blocks = double(fp8.blocks) / double(bf16.blocks);
  const double whole = double(fp8.root + fp8.blocks) / double(bf16.root + bf16.blocks);
  std::printf("FP8 / bf16 all-gather bytes: blocks %.4f, with the float32 root unit %.4f\n", blocks, whole);
  EXPECT_LE(blocks, 0.55);
}
