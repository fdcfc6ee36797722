// A hand-written reference of FP8 quantization, independent of ATen's FP8 casts: scales
// in float32 arithmetic (the rule the kernel states), v * scale rounded to float32, then
// to the nearest FP8 value in float64 (ties to even, subnormals kept, saturating), and
// dequantized and multiplied in float64.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "hp/tensor/fp8_quantize.h"

namespace hp::testing {

struct Fp8Bits {
  int mantissa, min_exponent;
  double max;
};
inline Fp8Bits fp8_bits(Fp8Format f) { return f == Fp8Format::E4M3 ? Fp8Bits{3, -6, 448.0} : Fp8Bits{2, -14, 57344.0}; }

// The nearest value of the format (v already in float32).
inline double round_to_fp8(double v, Fp8Format f) {
  const Fp8Bits b = fp8_bits(f);
  if (std::isnan(v)) return v;
  const double a = std::min(std::fabs(v), b.max);
  int e2 = 0;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  const int exponent = std::max(b.min_exponent, e2 - 1);
  const double ulp = std::ldexp(1.0, exponent - b.mantissa);
  return std::copysign(std::nearbyint(a / ulp) * ulp, v);  // the default rounding: to even
}

inline float reference_scale(float amax, Fp8Format f, Fp8Scaling s) {
  if (amax == 0) return 1.0f;
  if (s != Fp8Scaling::MxBlock) return std::min(FLT_MAX, static_cast<float>(fp8_bits(f).max) / amax);
  const int emax = f == Fp8Format::E4M3 ? 8 : 15;
  return std::ldexp(1.0f, std::clamp(emax - std::ilogb(amax), -126, 127));
}

inline double reference_round_trip(float v, float scale, Fp8Format f) {
  const float scaled = v * scale;
  const double m = fp8_bits(f).max;
  return round_to_fp8(std::clamp(static_cast<double>(scaled), -m, m), f) / scale;
}

// deq(q(a)) for a float32 matrix [rows, cols] whose cols are the reduction dim: one scale
// for all (tensorwise), per row (rowwise) or per row and block of 32 cols (mx_block).
inline at::Tensor reference_fake_quantize(const at::Tensor& a_in, Fp8Format f, Fp8Scaling s) {
  const at::Tensor a = a_in.to(at::kFloat).contiguous();
  const int64_t rows = a.size(0), cols = a.size(1);
  auto in = a.accessor<float, 2>();
  at::Tensor out = at::empty({rows, cols}, at::kDouble);
  auto o = out.accessor<double, 2>();
  float whole = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) whole = std::max(whole, std::fabs(in[r][c]));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols;) {
      const int64_t c1 = s == Fp8Scaling::MxBlock ? std::min(cols, c0 + 32) : cols;
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(in[r][c]));
      const float scale = reference_scale(s == Fp8Scaling::Tensorwise ? whole : amax, f, s);
      for (int64_t c = c0; c < c1; ++c) o[r][c] = reference_round_trip(in[r][c], scale, f);
      c0 = c1;
    }
  return out;
}

// The FP8 linear's three products in float64: x [tokens, in], w [out, in], dy [tokens, out].
struct ReferenceLinear {
  at::Tensor y, dx, dw;
};
inline ReferenceLinear reference_fp8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& dy,
                                            Fp8Scaling s) {
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  ReferenceLinear r;
  r.y = at::matmul(reference_fake_quantize(x, e4, s), reference_fake_quantize(w, e4, s).t());
  // dX contracts out-features: dy along its rows, w along its columns.
  r.dx = at::matmul(reference_fake_quantize(dy, e5, s), reference_fake_quantize(w.t(), e4, s).t());
  // dW contracts tokens: dy and x along their columns.
  r.dw = at::matmul(reference_fake_quantize(dy.t(), e5, s), reference_fake_quantize(x.t(), e4, s).t());
  return r;
}

}  // namespace hp::testing
