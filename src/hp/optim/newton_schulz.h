// The quintic Newton-Schulz iteration that Muon uses to orthogonalise an update: x is
// driven towards the nearest semi-orthogonal matrix, U V^T of its SVD.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace hp::comm {
class Group;
}

namespace hp::optim {

// On a full matrix, as two fused multiply-adds per step (ATen's matrix products, on any
// device), in `dtype` (float32 or bfloat16; the norm is taken in float32); the result is
// float32.
at::Tensor newton_schulz(const at::Tensor& g, int steps, at::ScalarType dtype = at::kFloat);

// The same iteration on matrices split over the ranks of `g` into blocks of columns: each
// rank passes its block of every matrix in the wide form (rows = the short side, the same
// on every rank; a block may have no columns) and gets its block of each result. The
// squared norms and the Gram matrices x x^T are summed over `g` (one all-reduce for the
// norms, one per iteration for the Gram matrices of all the matrices, summed in float32);
// the rest is local, in `dtype`. Every rank of `g` calls it with the same matrices in the
// same order.
std::vector<at::Tensor> newton_schulz_blocks(std::vector<at::Tensor> blocks, int steps, const comm::Group& g,
                                             at::ScalarType dtype = at::kFloat);

}  // namespace hp::optim
