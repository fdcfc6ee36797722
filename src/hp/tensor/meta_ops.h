// Shape-only stand-ins for ATen ops that LibTorch's C++ cannot run on meta tensors (PyTorch
// registers their meta kernels from Python). Used only where the device is meta (a
// dry-run); on other devices they are the ATen op.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace hp {

// at::embedding(table, ids). On meta (index_select and embedding_dense_backward have no
// C++ meta kernel): a [..., D] output whose backward gives the dense [V, D] gradient
// that embedding_dense_backward allocates.
at::Tensor embedding_lookup(const at::Tensor& table, const at::Tensor& ids);

// x.gather(-1, index). On meta, ATen's gather backward allocates x's gradient twice (its
// zeros, and an out-of-place scatter) where a CPU run scatters into the zeros: there, a
// stand-in whose backward allocates it once.
at::Tensor gather_last(const at::Tensor& x, const at::Tensor& index);

// a && b on booleans (logical_and has no C++ meta kernel; bitwise and gives the same
// bits on bool).
at::Tensor both(const at::Tensor& a, const at::Tensor& b);

// at::scaled_dot_product_attention(q, k, v, mask, 0, causal, scale, grouped-query when q
// has more heads than k). On meta (the C++ math path calls `where`, which has no C++ meta
// kernel): a [B, Hq, Sq, Dv] output that keeps q, k and v for its backward, as the fused
// kernels do, and whose backward gives their gradients.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, bool causal, std::optional<double> scale);

}  // namespace hp
