// The quintic Newton-Schulz iteration that Muon uses to orthogonalise an update: x is
// driven towards the nearest semi-orthogonal matrix, U V^T of its SVD.
#pragma once

#include <ATen/core/Tensor.h>

namespace hp::optim {

// On a full matrix, in float32. Float32 CPU matrices go through BLAS's symmetric kernels
// (ssyrk, ssymm) where LibTorch's BLAS library is at hand: x x^T and its square are
// symmetric, so half their products need not be computed (1.3-1.7x less time here).
at::Tensor newton_schulz(const at::Tensor& g, int steps);

// The same iteration as plain ATen matrix products, on any device: the reference.
at::Tensor newton_schulz_aten(const at::Tensor& g, int steps);

}  // namespace hp::optim
