// Shape-only stand-ins for ATen ops that LibTorch 1.13 cannot run on meta tensors. Used
// only where the device is meta (a dry-run); on other devices they are the ATen op.
#pragma once

#include <ATen/core/Tensor.h>

namespace hp {

// at::embedding(table, ids). On meta (index_select and embedding_dense_backward have no
// meta kernel in 1.13): a [..., D] output whose backward gives the dense [V, D] gradient
// that embedding_dense_backward allocates.
at::Tensor embedding_lookup(const at::Tensor& table, const at::Tensor& ids);

// a && b on booleans (logical_and has no meta kernel in 1.13; bitwise and gives the same
// bits on bool).
at::Tensor both(const at::Tensor& a, const at::Tensor& b);

}  // namespace hp
