#include "hp/optim/newton_schulz.h"

#include <ATen/ATen.h>

#include "hp/base/error.h"

#ifdef HP_HAVE_BLAS
extern "C" {
// Fortran BLAS (column-major), from the libblas.so.3 that LibTorch itself calls.
void ssyrk_(const char* uplo, const char* trans, const int* n, const int* k, const float* alpha, const float* a,
            const int* lda, const float* beta, float* c, const int* ldc);
void ssymm_(const char* side, const char* uplo, const int* m, const int* n, const float* alpha, const float* a,
            const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
}
#endif

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

#ifdef HP_HAVE_BLAS
// Row-major x (m x n) is column-major x^T (n x m, leading dimension n). Per step:
//   s = x x^T          ssyrk, upper triangle, mirrored to full
//   p = b s + c s s^T  ssyrk, upper triangle only
//   y = a x + p x      ssymm reading p's upper triangle
void iterate_blas(at::Tensor& x, int steps) {
  const int m = static_cast<int>(x.size(0)), n = static_cast<int>(x.size(1));
  const float one = 1, zero = 0, a = kA, b = kB, c = kC;
  at::Tensor s = at::empty({m, m}, x.options()), p = at::empty({m, m}, x.options());
  at::Tensor y = at::empty_like(x);
  for (int i = 0; i < steps; ++i) {
    float* sd = s.data_ptr<float>();
    ssyrk_("U", "T", &m, &n, &one, x.data_ptr<float>(), &n, &zero, sd, &m);
    for (int j = 0; j < m; ++j)  // column j's rows below the diagonal from row j's
      for (int r = j + 1; r < m; ++r) sd[r + j * m] = sd[j + r * m];
    p.copy_(s);
    ssyrk_("U", "N", &m, &m, &c, sd, &m, &b, p.data_ptr<float>(), &m);
    y.copy_(x);
    ssymm_("R", "U", &n, &m, &one, p.data_ptr<float>(), &m, x.data_ptr<float>(), &n, &a, y.data_ptr<float>(), &n);
    std::swap(x, y);
  }
}
#endif

}  // namespace

at::Tensor newton_schulz_aten(const at::Tensor& g, int steps) {
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

at::Tensor newton_schulz(const at::Tensor& g, int steps) {
#ifdef HP_HAVE_BLAS
  if (g.device().is_cpu() && g.numel() > 0) {
    bool tall = false;
    at::Tensor x = normalised_wide(g, tall);
    iterate_blas(x, steps);
    return tall ? x.t().contiguous() : x;
  }
#endif
  return newton_schulz_aten(g, steps);
}

}  // namespace hp::optim
