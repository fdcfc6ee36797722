#include "hp/tensor/fp8_quantize.h"

#include <ATen/ATen.h>

#include <limits>

#include "hp/base/error.h"

namespace hp {
namespace {

// The largest power-of-two exponent of a normal value in the format (448 = 1.75 * 2^8).
int fp8_emax(Fp8Format f) { return f == Fp8Format::E4M3 ? 8 : 15; }

// 2^e exactly, from the float32 bit pattern (e within the normal range).
at::Tensor exact_pow2(const at::Tensor& e) {
  at::Tensor biased = (e.clamp(-126, 127) + 127).to(at::kInt);
  return at::bitwise_left_shift(biased, 23).view(at::kFloat);
}

}  // namespace

double fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0 : 57344.0; }

at::ScalarType fp8_dtype(Fp8Format f) { return f == Fp8Format::E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2; }

Fp8Scaling parse_fp8_scaling(const std::string& name) {
  if (name == "tensorwise") return Fp8Scaling::Tensorwise;
  if (name == "rowwise") return Fp8Scaling::Rowwise;
  if (name == "mx_block") return Fp8Scaling::MxBlock;
  HP_FAIL() << "unknown FP8 scaling '" << name << "': expected tensorwise, rowwise or mx_block";
  return Fp8Scaling::Tensorwise;
}

const char* to_string(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::Tensorwise: return "tensorwise";
    case Fp8Scaling::Rowwise: return "rowwise";
    case Fp8Scaling::MxBlock: return "mx_block";
  }
  return "?";
}

at::Tensor fp8_scale(const at::Tensor& amax_in, Fp8Format f, Fp8Scaling s) {
  at::Tensor amax = amax_in.to(at::kFloat);
  at::Tensor zero = amax == 0;
  at::Tensor scale;
  if (s == Fp8Scaling::MxBlock) {
    // frexp: amax = m * 2^e with m in [0.5, 1), so floor(log2 amax) = e - 1.
    at::Tensor e = std::get<1>(at::frexp(amax)).to(at::kInt) - 1;
    scale = exact_pow2(fp8_emax(f) - e);
  } else {
    scale = (fp8_max(f) / amax).clamp_max(std::numeric_limits<float>::max());
  }
  return at::where(zero, at::ones_like(scale), scale);
}

at::Tensor Fp8Tensor::dequantized() const { return fp8_dequantize(data, scale); }

at::Tensor fp8_dequantize(const at::Tensor& q, const at::Tensor& scale) { return q.to(at::kFloat) / scale; }

Fp8Tensor fp8_cast(const at::Tensor& x, const at::Tensor& scale, Fp8Format f) {
  HP_CHECK(x.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat)
      << "FP8 quantization takes float32 values and scales, got " << x.scalar_type() << " and "
      << scale.scalar_type();
  const double m = fp8_max(f);
  return {(x * scale).clamp(-m, m).to(fp8_dtype(f)), scale};
}

at::Tensor fp8_round_trip(const at::Tensor& x, const at::Tensor& scale, Fp8Format f) {
  return fp8_cast(x, scale, f).dequantized();
}

}  // namespace hp
