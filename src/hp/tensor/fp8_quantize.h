// FP8 quantization of local tensors: formats, scales from an amax, and the round trip
// quantize -> dequantize whose result a float32 product turns into what an FP8 GEMM with
// float32 accumulation computes. A value v with scale s becomes
//   q = fp8(clamp(v * s, -max, max)),   deq = float(q) / s,
// with v * s rounded to float32 first, then to the nearest FP8 value (ties to even),
// subnormals kept. NaN stays NaN.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace hp {

// E4M3 (no infinities, largest 448) for weights and activations; E5M2 (largest 57344)
// for gradients, which need range more than precision.
enum class Fp8Format { E4M3, E5M2 };
double fp8_max(Fp8Format f);
at::ScalarType fp8_dtype(Fp8Format f);

// Which elements share a scale, along the reduction dim of the product they feed:
//   Tensorwise: the whole tensor.
//   Rowwise:    each row along the reduction dim (one scale per token of x, per output row
//               of the weight in the forward product).
//   MxBlock:    each block of 32 consecutive elements of the reduction dim, counted from
//               the tensor's first element (global index / 32); the last block of a dim
//               not divisible by 32 is short, as if zero-padded. Scales are powers of two.
enum class Fp8Scaling { Tensorwise, Rowwise, MxBlock };
Fp8Scaling parse_fp8_scaling(const std::string& name);  // "tensorwise", "rowwise", "mx_block"
const char* to_string(Fp8Scaling s);
constexpr int64_t kMxBlock = 32;

// float32 scales from float32 amaxes (any shape). An amax of 0 gives 1.
//   Tensorwise, Rowwise: max / amax, held at float32's largest finite value.
//   MxBlock: 2^(emax - floor(log2 amax)), emax the format's largest exponent (8 for E4M3,
//   15 for E5M2), as OCP MX's shared exponent: the block's largest element lands in the
//   format's top binade and may saturate (an amax of 500 keeps scale 1, 500 -> 448).
at::Tensor fp8_scale(const at::Tensor& amax, Fp8Format f, Fp8Scaling s);

// Values quantized to FP8: `data` in the format's dtype and the float32 `scale` they were
// multiplied by, broadcast against it. deq = float(data) / scale.
struct Fp8Tensor {
  at::Tensor data, scale;
  at::Tensor dequantized() const;
  Fp8Tensor t() const { return {data.t(), scale.dim() == 2 ? scale.t() : scale}; }  // a view of the transpose
};

// q(x) with `scale` broadcast against x (float32 both).
Fp8Tensor fp8_cast(const at::Tensor& x, const at::Tensor& scale, Fp8Format f);

// deq(q(x)): fp8_cast(x, scale, f).dequantized().
at::Tensor fp8_round_trip(const at::Tensor& x, const at::Tensor& scale, Fp8Format f);
// float(q) / scale: the second half of fp8_round_trip, for FP8 values that travel
// (fully_shard's FP8 all-gather casts shards and dequantizes the gathered pieces:
// elementwise, so the same bits as fp8_round_trip of the whole).
at::Tensor fp8_dequantize(const at::Tensor& q, const at::Tensor& scale);

}  // namespace hp
