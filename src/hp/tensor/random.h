// A counter-based random generator: element i of a tensor drawn at state (seed, offset)
// is a pure function of (seed, offset + i) for uniforms and of (seed, offset + 2i,
// offset + 2i + 1) for normals, i its row-major index in the global tensor. A shard draws
// exactly its piece of what one device draws for the whole tensor, on any layout, with no
// communication. Each draw advances the offset past every counter it consumed (numel or
// 2·numel), so no two draws share one and ranks that make the same calls stay in step.
// State is per thread (ranks as threads).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hp/tensor/dtensor.h"

namespace hp {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

void manual_seed(uint64_t seed);
RngState get_rng_state();
void set_rng_state(RngState state);
// Advances the state past what randn(shape) would draw, drawing nothing, and returns the
// state that draw would have started at: randn(shape, ...) at that state later gives the
// same numbers (deferred initialisation draws each shard so).
RngState reserve_randn(const std::vector<int64_t>& shape);

// One device: the whole tensor.
at::Tensor rand(const std::vector<int64_t>& shape, at::ScalarType dtype = at::kFloat);   // U[0, 1)
at::Tensor randn(const std::vector<int64_t>& shape, at::ScalarType dtype = at::kFloat);  // N(0, 1)
at::Tensor dropout(const at::Tensor& x, double p);  // zeroes with probability p, scales by 1/(1-p)

// On a mesh: each rank draws its own piece.
DTensor rand(const std::vector<int64_t>& shape, const DeviceMesh& mesh, std::vector<Placement> placements,
             at::ScalarType dtype = at::kFloat);
DTensor randn(const std::vector<int64_t>& shape, const DeviceMesh& mesh, std::vector<Placement> placements,
              at::ScalarType dtype = at::kFloat);
DTensor dropout(const DTensor& x, double p);

}  // namespace hp
