// The quintic Newton-Schulz iteration that Muon uses to orthogonalise an update: x is
// driven towards the nearest semi-orthogonal matrix, U V^T of its SVD.
#pragma once

#include <ATen/core/Tensor.h>

namespace hp::optim {

// On a full matrix, in float32, as two fused multiply-adds per step (ATen's matrix
// products, on any device).
at::Tensor newton_schulz(const at::Tensor& g, int steps);

}  // namespace hp::optim
