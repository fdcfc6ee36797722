// The one-pass CPU kernels against the ATen compositions they replace: values and
// gradients, float64 to 1e-12 and float32 to float rounding; rotary bitwise (the same
// products and sums, in the same order).
#include "hp/tensor/fused_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "hp/tensor/memory_stats.h"

namespace hp {
namespace {

at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean({-1}, true) + eps) * w;
}

at::Tensor rotary_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

struct Grads {
  at::Tensor out, dx, dw;
};

// Forward, then backward of a random weighting of the output.
template <typename Fn>
Grads run(Fn fn, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& weighting) {
  at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::Tensor out = fn(x, w);
  (out * weighting).sum().backward();
  return {out.detach(), x.grad(), w.grad()};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, rtol, atol)) << what << ": max abs diff " << (got - want).abs().max().item<double>();
}

TEST(FusedRMSNorm, MatchesTheComposition) {
  at::manual_seed(3);
  // Rows of 256 (16-lane sums), of 37 (a remainder), a single row, and none.
  for (auto shape : {std::vector<int64_t>{4, 9, 256}, {5, 37}, {1, 16}, {0, 8}})
    for (auto dtype : {at::kDouble, at::kFloat}) {
      const at::Tensor x = at::randn(shape, dtype) * 3, w = at::randn({shape.back()}, dtype);
      const at::Tensor weighting = at::randn(shape, dtype);
      ASSERT_TRUE(fused::rms_norm_fusable(x, w));
      const Grads got = run([](auto& a, auto& b) { return fused::rms_norm(a, b, 1e-6); }, x, w, weighting);
      const Grads want = run([](auto& a, auto& b) { return rms_norm_composite(a, b, 1e-6); }, x, w, weighting);
      const double tol = dtype == at::kDouble ? 1e-12 : 2e-6;
      expect_close(got.out, want.out, tol, tol, "output");
      expect_close(got.dx, want.dx, tol, tol, "input gradient");
      expect_close(got.dw, want.dw, tol, tol * 10, "weight gradient");  // summed over rows
    }
}

TEST(FusedRMSNorm, OnlyWhereItApplies) {
  const at::Tensor x = at::randn({4, 8}), w = at::randn({8});
  EXPECT_TRUE(fused::rms_norm_fusable(x, w));
  EXPECT_FALSE(fused::rms_norm_fusable(x.to(at::kBFloat16), w.to(at::kBFloat16)));  // the composition
  EXPECT_FALSE(fused::rms_norm_fusable(x, w.to(at::kDouble)));
  EXPECT_FALSE(fused::rms_norm_fusable(x.t(), w));  // rows not contiguous
  EXPECT_FALSE(fused::rms_norm_fusable(x, at::randn({4})));
  ::setenv("HP_FUSED_KERNELS", "0", 1);
  EXPECT_FALSE(fused::rms_norm_fusable(x, w));
  ::unsetenv("HP_FUSED_KERNELS");
  // Meta: shapes only, and the saved tensors of a CPU run.
  const at::Tensor xm = at::empty({4, 8}, at::device(at::kMeta)).requires_grad_();
  const at::Tensor wm = at::empty({8}, at::device(at::kMeta)).requires_grad_();
  ASSERT_TRUE(fused::rms_norm_fusable(xm, wm));
  at::Tensor y = fused::rms_norm(xm, wm, 1e-6);
  EXPECT_TRUE(y.is_meta());
  y.sum().backward();
  EXPECT_EQ(xm.grad().sizes(), xm.sizes());
  EXPECT_EQ(wm.grad().sizes(), wm.sizes());
}

TEST(FusedRotary, BitwiseTheCompositionOnStridedHeads) {
  at::manual_seed(4);
  const int64_t b = 2, s = 7, h = 3;
  for (int64_t d : {10, 42})  // half 5: the remainder alone; 21: two blocks of lanes and a remainder
  for (auto dtype : {at::kFloat, at::kDouble}) {
    // [B, S, H, D] projections seen as [B, H, S, D], as the attention hands them over.
    const at::Tensor x = at::randn({b, s, h, d}, dtype).transpose(1, 2);
    const at::Tensor angle = at::arange(s, dtype).unsqueeze(1) * at::rand({d / 2}, dtype).unsqueeze(0);
    const at::Tensor cos = angle.cos(), sin = angle.sin();
    const at::Tensor weighting = at::randn({b, h, s, d}, dtype);
    ASSERT_TRUE(fused::rotary_fusable(x, cos, sin));
    auto leaf = [](const at::Tensor& t) { return t.detach().clone().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(); };
    at::Tensor x1 = leaf(x), x2 = leaf(x);
    at::Tensor got = fused::rotary(x1, cos, sin), want = rotary_composite(x2, cos, sin);
    (got * weighting).sum().backward();
    (want * weighting).sum().backward();
    EXPECT_TRUE(at::equal(got, want)) << "head dim " << d;
    EXPECT_TRUE(at::equal(x1.grad(), x2.grad())) << "head dim " << d;
    // Laid out as its input, [B, S, H, D] in storage: attention's output then goes back
    // to [B, S, H * D] without a copy.
    EXPECT_EQ(got.strides(), x1.strides());
    EXPECT_TRUE(got.transpose(1, 2).is_contiguous());
  }
  {  // a strided input that is not dense (a narrowed head dim) gives a contiguous output
    const at::Tensor wide = at::randn({2, 3, 7, 12}), x = wide.narrow(-1, 0, 10);
    const at::Tensor angle = at::arange(7, at::kFloat).unsqueeze(1) * at::rand({5}).unsqueeze(0);
    ASSERT_TRUE(fused::rotary_fusable(x, angle.cos(), angle.sin()));
    const at::Tensor got = fused::rotary(x, angle.cos(), angle.sin());
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(at::equal(got, rotary_composite(x, angle.cos(), angle.sin())));
  }
  const at::Tensor x = at::randn({1, 1, 4, 6});
  EXPECT_FALSE(fused::rotary_fusable(x, at::randn({4, 2}), at::randn({4, 2})));  // tables of the wrong width
  EXPECT_FALSE(fused::rotary_fusable(x.to(at::kBFloat16), at::randn({4, 3}), at::randn({4, 3})));
}

// Large values too: silu's tails (sigmoid near 0 and 1) must not lose the gradient.
TEST(FusedSwiGLU, MatchesTheComposition) {
  at::manual_seed(5);
  for (auto shape : {std::vector<int64_t>{3, 70000}, {5, 37}, {0, 8}})
    for (auto dtype : {at::kDouble, at::kFloat}) {
      const at::Tensor gate = at::randn(shape, dtype) * 6, up = at::randn(shape, dtype);
      const at::Tensor weighting = at::randn(shape, dtype);
      ASSERT_TRUE(fused::swiglu_fusable(gate, up));
      const Grads got = run([](auto& g, auto& u) { return fused::swiglu(g, u); }, gate, up, weighting);
      const Grads want = run([](auto& g, auto& u) { return at::silu(g) * u; }, gate, up, weighting);
      const double tol = dtype == at::kDouble ? 1e-12 : 2e-6;
      expect_close(got.out, want.out, tol, tol, "output");
      expect_close(got.dx, want.dx, tol, tol, "gate gradient");
      expect_close(got.dw, want.dw, tol, tol, "up gradient");
    }
}

// Gradients of swiglu(a * 2, b * 2) with respect to a and b, where nothing but swiglu's
// node holds gate and up, and the counted memory its backward allocates; `square_too`
// saves gate in a second node too (gate * gate + y).
struct ReuseRun {
  at::Tensor da, db;
  int64_t backward_bytes = 0;
};
// One backward through swiglu(2a, 2b) (plus (2a)^2 where `square_too`); `retain` keeps the
// graph, which forbids writing over the saved inputs.
ReuseRun run_swiglu_backward(bool retain, bool square_too) {
  track_cpu_memory();
  at::manual_seed(9);
  at::Tensor a = at::randn({64, 256}).requires_grad_(), b = at::randn({64, 256}).requires_grad_();
  const at::Tensor weighting = at::randn({64, 256});
  at::Tensor y;
  {
    at::Tensor gate = a * 2, up = b * 2;
    // Made first, the square's node runs its backward after swiglu's (autograd runs the
    // later node first).
    const at::Tensor square = square_too ? gate * gate : at::Tensor();
    y = fused::swiglu(gate, up);
    if (square_too) y = y + square;
  }
  reset_cpu_memory_peak();
  const int64_t before = cpu_memory_allocated();
  y.backward(weighting, /*retain_graph=*/retain);
  return {a.grad(), b.grad(), cpu_memory_peak() - before};
}

TEST(FusedSwiGLU, WritesItsInputGradientsOverInputsNothingElseHolds) {
  const ReuseRun kept = run_swiglu_backward(true, false), reused = run_swiglu_backward(false, false);
  EXPECT_TRUE(at::equal(reused.da, kept.da));
  EXPECT_TRUE(at::equal(reused.db, kept.db));
  // With the graph kept the gradients of gate and up are new tensors beside gate and up.
  const int64_t one = 64 * 256 * 4;
  EXPECT_LE(reused.backward_bytes + one, kept.backward_bytes)
      << "reused " << reused.backward_bytes << " B, kept " << kept.backward_bytes << " B";
}

TEST(FusedSwiGLU, KeepsInputsAnotherNodeSaved) {
  // gate * gate's backward reads gate after swiglu's: overwriting it would change da.
  const ReuseRun kept = run_swiglu_backward(true, true), reused = run_swiglu_backward(false, true);
  EXPECT_TRUE(at::equal(reused.da, kept.da));
  EXPECT_TRUE(at::equal(reused.db, kept.db));
}

TEST(FusedSwiGLU, ASecondBackwardOfARetainedGraphReadsTheSameInputs) {
  at::manual_seed(9);
  at::Tensor a = at::randn({64, 256}).requires_grad_(), b = at::randn({64, 256}).requires_grad_();
  at::Tensor y = fused::swiglu(a * 2, b * 2);
  y.sum().backward({}, /*retain_graph=*/true);
  const at::Tensor da = a.grad().clone(), db = b.grad().clone();
  y.sum().backward();
  EXPECT_TRUE(at::equal(a.grad(), 2 * da));
  EXPECT_TRUE(at::equal(b.grad(), 2 * db));
}

TEST(FusedSwiGLU, OnlyWhereItApplies) {
  const at::Tensor g = at::randn({4, 8}), u = at::randn({4, 8});
  EXPECT_TRUE(fused::swiglu_fusable(g, u));
  EXPECT_FALSE(fused::swiglu_fusable(g.to(at::kBFloat16), u.to(at::kBFloat16)));  // the composition
  EXPECT_FALSE(fused::swiglu_fusable(g, u.to(at::kDouble)));
  EXPECT_FALSE(fused::swiglu_fusable(g.t(), u.t()));  // not contiguous
  EXPECT_FALSE(fused::swiglu_fusable(g, at::randn({8})));
  ::setenv("HP_FUSED_KERNELS", "0", 1);
  EXPECT_FALSE(fused::swiglu_fusable(g, u));
  ::unsetenv("HP_FUSED_KERNELS");
  // Meta: shapes only, and the saved tensors of a CPU run.
  const at::Tensor gm = at::empty({4, 8}, at::device(at::kMeta)).requires_grad_();
  const at::Tensor um = at::empty({4, 8}, at::device(at::kMeta)).requires_grad_();
  ASSERT_TRUE(fused::swiglu_fusable(gm, um));
  at::Tensor y = fused::swiglu(gm, um);
  EXPECT_TRUE(y.is_meta());
  y.sum().backward();
  EXPECT_EQ(gm.grad().sizes(), gm.sizes());
  EXPECT_EQ(um.grad().sizes(), um.sizes());
}

// The kernels split their rows over ATen's intra-op threads (fused_cpu.cpp is compiled
// with OpenMP, on LibTorch's runtime): without it they ran on one core of a two-thread process.
TEST(FusedCpu, KernelsSplitTheirRowsOverTheIntraOpThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  EXPECT_EQ(fused::threads_for_rows(1024), 2);
  EXPECT_EQ(fused::threads_for_rows(8), 1);  // under one task's rows
  at::set_num_threads(before);
}

}  // namespace
}  // namespace hp
