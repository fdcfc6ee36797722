#include "hp/optim/newton_schulz.h"

#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"

namespace hp::optim {
namespace {

constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;  // quintic coefficients with a fast rise near 0

void check_dtype(at::ScalarType dtype) {
  HP_CHECK(dtype == at::kFloat || dtype == at::kBFloat16)
      << "newton_schulz: the iteration runs in float32 or bfloat16, not " << dtype;
}

// x (m x n, m <= n) scaled to norm 1 in float32, then in `dtype`, contiguous.
at::Tensor normalised_wide(const at::Tensor& g, at::ScalarType dtype, bool& tall) {
  HP_CHECK(g.dim() == 2) << "newton_schulz: a matrix is needed, got shape " << g.sizes();
  at::Tensor x = g.to(at::kFloat);
  tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  return (x / (x.norm() + 1e-7)).to(dtype).contiguous();
}

}  // namespace

at::Tensor newton_schulz(const at::Tensor& g, int steps, at::ScalarType dtype) {
  check_dtype(dtype);
  bool tall = false;
  at::Tensor x = normalised_wide(g, dtype, tall);
  // x <- a x + (b s + c s^2) x with s = x x^T, as two fused multiply-adds.
  for (int i = 0; i < steps; ++i) {
    at::Tensor s = at::mm(x, x.t());
    at::Tensor poly = at::addmm(s, s, s, /*beta=*/kB, /*alpha=*/kC);
    x = at::addmm(x, poly, x, /*beta=*/kA, /*alpha=*/1);
  }
  x = x.to(at::kFloat);
  return tall ? x.t().contiguous() : x;
}

std::vector<at::Tensor> newton_schulz_blocks(std::vector<at::Tensor> blocks, int steps, const comm::Group& g,
                                             at::ScalarType dtype) {
  check_dtype(dtype);
  if (blocks.empty()) return blocks;
  std::vector<at::Tensor> squares;
  for (at::Tensor& x : blocks) {
    HP_CHECK(x.dim() == 2) << "newton_schulz_blocks: a block of a matrix is needed, got shape " << x.sizes();
    x = x.to(at::kFloat).contiguous();
    squares.push_back(x.square().sum());
  }
  at::Tensor norms = comm::all_reduce_(at::stack(squares), g).sqrt_();
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = (blocks[i] / (norms[i] + 1e-7)).to(dtype);
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> grams;
    for (const at::Tensor& x : blocks) grams.push_back(at::mm(x, x.t()).reshape({-1}).to(at::kFloat));
    at::Tensor summed = comm::all_reduce_(at::cat(grams), g);
    int64_t at_ = 0;
    for (at::Tensor& x : blocks) {
      const int64_t rows = x.size(0);
      at::Tensor s = summed.narrow(0, at_, rows * rows).view({rows, rows}).to(dtype);
      at_ += rows * rows;
      at::Tensor poly = at::addmm(s, s, s, /*beta=*/kB, /*alpha=*/kC);
      x = at::addmm(x, poly, x, /*beta=*/kA, /*alpha=*/1);
    }
  }
  for (at::Tensor& x : blocks) x = x.to(at::kFloat);
  return blocks;
}

}  // namespace hp::optim
