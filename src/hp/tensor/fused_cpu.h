// One-pass CPU kernels, with their own backward, for ops that eager ATen runs as a chain of
// elementwise passes: RMSNorm (six passes forward, about a dozen backward, and a saved
// normalised copy of its input), rotary embeddings (seven passes forward, about as many
// backward; its backward is the inverse rotation) and SwiGLU's silu(gate) * up (which
// eagerly keeps silu's output beside gate and up).
// Float32/float64 CPU tensors only (`*_fusable` says), and meta ones, which get the shapes
// and saved tensors of a CPU run; callers keep the ATen composition for the rest (CUDA,
// reduced precision).
#pragma once

#include <ATen/core/Tensor.h>

namespace hp::fused {

// Off with HP_FUSED_KERNELS=0 (read at each call, so that a bench can alternate): every op
// then runs as its ATen composition.
bool enabled();

// How many of ATen's intra-op threads these kernels split `rows` rows over (the tasks of
// at::parallel_for that got rows): 1 in a build whose kernels were compiled without OpenMP.
int threads_for_rows(int64_t rows);

// x [..., D] contiguous, weight [D], same float32/float64 dtype and device (CPU or meta).
bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight);
// x * rsqrt(mean(x^2 over the last dim) + eps) * weight. Keeps x, weight and one 1/rms per
// row for backward.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x [B, H, S, D] (any strides, the last dim unit-stride), cos and sin [S, D/2] contiguous,
// all of one float32/float64 dtype and device (CPU or meta).
bool rotary_fusable(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin) of the halves x1, x2 of the last dim, laid
// out as x where x is dense (else contiguous). Keeps only the tables for backward.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// gate and up of one shape, contiguous, same float32/float64 dtype and device (CPU or meta).
bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up);
// silu(gate) * up, contiguous. Keeps gate and up for backward (both a matmul's outputs,
// kept anyway), not silu's output; the sigmoid is computed again there. Its backward writes
// the gradients over gate and up where nothing else can see them (the backward keeps no
// graph, and the saved tensor is its storage's only one) instead of holding all four.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace hp::fused
