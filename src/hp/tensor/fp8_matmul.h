// The product of two FP8 operands, each quantized along the reduction dim:
//   fp8_mm(a [m, k], b [n, k]) = deq(a) . deq(b)^T in float32.
// On CUDA devices with FP8 GEMMs (compute capability >= 8.9) at::_scaled_mm computes it
// for tensorwise and rowwise scales (with float32 accumulation and output); everywhere
// else, and for what _scaled_mm refuses, it is the float32 product of the dequantized
// operands (the emulated path, the only one on CPU). mx_block stays emulated: LibTorch
// 2.11 takes 1x32 block scales only as swizzled e8m0 on compute capability 10.x
// (_scaled_mm_v2), not on Hopper.
#pragma once

#include <string>

#include "hp/tensor/fp8_quantize.h"

namespace hp {

at::Tensor fp8_mm(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Scaling s);

// Why fp8_mm(a, b, s) takes the emulated path ("" when it takes _scaled_mm), for checks
// and logs. A refusal by _scaled_mm itself is only known once tried: after it, the
// reason is the error, remembered for that scaling and pair of formats.
std::string fp8_mm_fallback(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Scaling s);

}  // namespace hp
