// FP8 linear layers chosen by apply_low_precision, on the tiny Llama. The reference is the
// single-process FP8 run (every block Linear in FP8, the head in float32); tensor and
// data parallel layouts must give the same losses, first gradients and final parameters
// after 5 AdamW steps within float32 tolerance: relative 1e-5, absolute 1e-6 (as for
// float32 tensor parallelism). The scales are those of whole tensors, so every layout
// quantizes the same operands up to float32 summation order.
//
// That order can still move a value across an FP8 rounding midpoint (about one element in
// a million lies within float32 noise of one), and then the runs differ by one FP8 step
// there and drift apart. These seeds cross none in 5 steps, except delayed scaling under
// tensor parallelism: one dY element of step 2 lies 1e-7 from an E5M2 midpoint, so the
// delayed runs are compared over 2 steps (step 1 already scales from the history); and
// tensorwise at tp = 4, which crosses one in step 4's backward since SwiGLU runs in one
// pass (a parameter 2.5e-6 off after step 5, within tolerance after 4), so it runs 4.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/tensor/fp8_linear.h"
#include "parallel/llama_run.h"

using namespace hp;

namespace {

using hp::testing::LlamaRun;

LowPrecisionConfig fp8(const std::string& scaling, bool delayed = false) {
  LowPrecisionConfig c;
  c.scaling = scaling;
  c.delayed = delayed;
  return c;
}

hp::testing::LlamaRunSpec fp8_spec(int64_t dp, int64_t tp, bool sp, const LowPrecisionConfig& config, int64_t steps = 5) {
  hp::testing::LlamaRunSpec spec;
  spec.mesh_shape = {dp, tp};
  spec.mesh_names = {"dp", "tp"};
  spec.steps = config.delayed ? 2 : steps;
  spec.parallelize = [tp, sp, config](nn::Llama& model, const DeviceMesh& mesh) {
    if (tp > 1) parallelize_llama(model, mesh["tp"], {sp, /*loss_parallel=*/true});
    apply_low_precision(model, config);
    return std::function<void(bool)>();
  };
  return spec;
}

const LlamaRun& fp8_reference(const std::string& scaling, bool delayed = false, int64_t steps = 5) {
  static std::map<std::string, LlamaRun> cache;
  const std::string key = scaling + (delayed ? " delayed" : "") + " " + std::to_string(steps);
  if (!cache.count(key)) cache[key] = hp::testing::train_llama(fp8_spec(1, 1, false, fp8(scaling, delayed), steps));
  return cache[key];
}

void expect_matches_fp8_reference(int64_t dp, int64_t tp, bool sp, const std::string& scaling, bool delayed = false,
                                  int64_t steps = 5) {
  const LlamaRun& ref = fp8_reference(scaling, delayed, steps);
  hp::testing::expect_runs_match(hp::testing::train_llama(fp8_spec(dp, tp, sp, fp8(scaling, delayed), steps)), ref);
}

}  // namespace

TEST(LowPrecision, Tp2Tensorwise) { expect_matches_fp8_reference(1, 2, false, "tensorwise"); }
TEST(LowPrecision, Dp2Tp2Tensorwise) { expect_matches_fp8_reference(2, 2, false, "tensorwise"); }
TEST(LowPrecision, Tp4Tensorwise) { expect_matches_fp8_reference(1, 4, false, "tensorwise", false, 4); }
TEST(LowPrecision, Dp2Tensorwise) { expect_matches_fp8_reference(2, 1, false, "tensorwise"); }
TEST(LowPrecision, Tp2SequenceParallelTensorwise) { expect_matches_fp8_reference(1, 2, true, "tensorwise"); }
TEST(LowPrecision, Tp2Rowwise) { expect_matches_fp8_reference(1, 2, false, "rowwise"); }
TEST(LowPrecision, Dp2Tp2Rowwise) { expect_matches_fp8_reference(2, 2, false, "rowwise"); }
TEST(LowPrecision, Tp4Rowwise) { expect_matches_fp8_reference(1, 4, false, "rowwise"); }
TEST(LowPrecision, Tp2SequenceParallelRowwise) { expect_matches_fp8_reference(1, 2, true, "rowwise"); }
TEST(LowPrecision, Tp2MxBlock) { expect_matches_fp8_reference(1, 2, false, "mx_block"); }
TEST(LowPrecision, Dp2Tp2MxBlock) { expect_matches_fp8_reference(2, 2, false, "mx_block"); }
TEST(LowPrecision, Tp4MxBlock) { expect_matches_fp8_reference(1, 4, false, "mx_block"); }
TEST(LowPrecision, Tp2TensorwiseDelayed) { expect_matches_fp8_reference(1, 2, false, "tensorwise", true); }
TEST(LowPrecision, Dp2Tp2TensorwiseDelayed) { expect_matches_fp8_reference(2, 2, false, "tensorwise", true); }
TEST(LowPrecision, Dp2TensorwiseDelayed) { expect_matches_fp8_reference(2, 1, false, "tensorwise", true); }

TEST(LowPrecision, AppliedBeforeTensorParallelism) {
  hp::testing::LlamaRunSpec spec = fp8_spec(1, 2, false, fp8("rowwise"));
  spec.parallelize = [](nn::Llama& model, const DeviceMesh& mesh) {
    apply_low_precision(model, fp8("rowwise"));
    parallelize_llama(model, mesh["tp"]);
    return std::function<void(bool)>();
  };
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), fp8_reference("rowwise"));
}

TEST(LowPrecision, Fp8ChangesTheRunAndStillLearns) {
  LlamaRun plain = hp::testing::train_llama(hp::testing::LlamaRunSpec());
  for (const char* scaling : {"tensorwise", "rowwise", "mx_block"}) {
    const LlamaRun& run = fp8_reference(scaling);
    EXPECT_NE(run.losses[1], plain.losses[1]) << scaling;
    EXPECT_NEAR(run.losses[1], plain.losses[1], 0.05 * plain.losses[1]) << scaling;
    EXPECT_LT(run.losses.back(), run.losses.front()) << scaling;
  }
}

TEST(LowPrecision, SwapsTheChosenLinearsOnly) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    auto names = apply_low_precision(model, LowPrecisionConfig());
    EXPECT_EQ(names.size(), 14u);  // 7 per block, the head excluded
    EXPECT_EQ(names.front(), "layers.0.attn.q_proj");
    EXPECT_EQ(std::count(names.begin(), names.end(), "output"), 0);

    LowPrecisionConfig some;
    some.include_fqns = {"layers.*.mlp.*"};
    some.exclude_fqns = {"layers.1.mlp.down_proj"};
    EXPECT_EQ(apply_low_precision(model, some).size(), 5u);

    LowPrecisionConfig typo;
    typo.include_fqns = {"layers.*.atn.q_proj"};
    EXPECT_THROW(apply_low_precision(model, typo), hp::Error);
    LowPrecisionConfig e5m2;
    e5m2.format = "e5m2";
    EXPECT_THROW(apply_low_precision(model, e5m2), hp::Error);
    EXPECT_THROW(apply_low_precision(model, fp8("rowwise", /*delayed=*/true)), hp::Error);
    EXPECT_THROW(apply_low_precision(model, fp8("blockwise")), hp::Error);
  });
}

TEST(LowPrecision, TensorwiseAmaxReductionsGoThroughTheCollectiveLog) {
  // Column parallel: W is sharded (one amax all-reduce in forward), x is replicated (none),
  // dY is sharded on its last dim (one in backward); dX's all-reduce sums a whole gradient.
  at::manual_seed(7);
  const at::Tensor x = at::randn({3, 16});
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    manual_seed(1);
    nn::Linear lin(16, 8, mesh);
    parallelize_module(lin, mesh, {{"", ColwiseParallel()}});
    apply_low_precision(lin, LowPrecisionConfig());
    DTensor in = distribute_tensor(x, mesh, {Replicate()});
    in.requires_grad_(true);
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    lin(in).to_local().sum().backward();
    log.enable(false);
    int scalar_all_reduces = 0, others = 0;
    for (const auto& r : log.records()) (r.op == "all_reduce" && r.numel == 1 ? scalar_all_reduces : others) += 1;
    EXPECT_EQ(scalar_all_reduces, 2) << "rank " << rank;
    EXPECT_EQ(others, 1) << "rank " << rank;  // dX
  });
}

TEST(LowPrecision, DelayedScalingLagsAJumpInAmax) {
  // W = identity (amax 1, exact in E4M3): y shows deq(q(x)). History of 3 calls.
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    Fp8LinearOptions o;
    o.delayed = true;
    o.history_len = 3;
    Fp8Linear fp8_linear(o), dynamic;
    DTensor w = distribute_tensor(at::eye(8), mesh, {Replicate()});
    auto run = [&](const Fp8Linear& f, float first) {
      at::Tensor x = at::ones({1, 8});
      x[0][0] = first;
      return f(distribute_tensor(x, mesh, {Replicate()}), w).to_local()[0];
    };
    for (int i = 0; i < 3; ++i) EXPECT_EQ(run(fp8_linear, 1)[0].item<float>(), 1.0f);
    // The jump is quantized with the history's amax of 1: 10 saturates at 448 / 448.
    EXPECT_EQ(run(fp8_linear, 10)[0].item<float>(), 1.0f);
    EXPECT_NEAR(run(dynamic, 10)[0].item<float>(), 10.0f, 1e-5);
    // For the next 3 calls the history holds 10: scale 44.8, so 1 -> 44 / 44.8.
    for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(run(fp8_linear, 1)[1].item<float>(), 44.0f / 44.8f) << i;
    // Then it has left the history.
    EXPECT_EQ(run(fp8_linear, 1)[1].item<float>(), 1.0f);
    EXPECT_EQ(fp8_linear.histories().input->recorded(), 3);
  });
}
