#include "hp/optim/newton_schulz.h"

#include <ATen/ATen.h>

#include "hp/base/error.h"

namespace hp::optim {
namespace {

constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;  // quintic coefficients with a fast rise near 0

// x (m x n, m <= n) scaled to norm 1, float32, contiguous.
at::Tensor normalised_wide(const at::Tensor& g, bool& tall) {
  HP_CHECK(g.dim() == 2) << "newton_schulz: a matrix is needed, got shape " << g.sizes();
  at::Tensor x = g.to(at::kFloat);
  tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  return (x / (x.norm() + 1e-7)).contiguous();
}

}  // namespace

at::Tensor newton_schulz(const at::Tensor& g, int steps) {
  bool tall = false;
  at::Tensor x = normalised_wide(g, tall);
  // x <- a x + (b s + c s^2) x with s = x x^T, as two fused multiply-adds.
  for (int i = 0; i < steps; ++i) {
    at::Tensor s = at::mm(x, x.t());
    at::Tensor poly = at::addmm(s, s, s, /*beta=*/kB, /*alpha=*/kC);
    x = at::addmm(x, poly, x, /*beta=*/kA, /*alpha=*/1);
  }
  return tall ? x.t().contiguous() : x;
}

}  // namespace hp::optim
