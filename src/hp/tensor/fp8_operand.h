// One operand of an FP8 product as this rank holds it: a local matrix [rows, reduction]
// (the product contracts `reduction`) and, for each axis, the mesh dims that split it and
// the global positions of the local entries. From these, the amax of every group of
// elements sharing a scale is that of the whole tensor, reduced over the ranks that hold
// the group's pieces.
#pragma once

#include <vector>

#include "hp/comm/device_mesh.h"
#include "hp/layout/shard_spec.h"
#include "hp/tensor/amax_history.h"
#include "hp/tensor/fp8_quantize.h"

namespace hp {

struct Fp8Axis {
  std::vector<int> mesh_dims;  // that split this axis
  at::Tensor index;            // int64 [local length]: global positions of the local entries
  int64_t global_size = 0;
};

struct Fp8Operand {
  at::Tensor local;  // [rows, reduction], float32
  Fp8Axis rows, reduction;
};

// Dim `d` of a tensor laid out as `spec`, at mesh coordinate `coord`.
Fp8Axis fp8_axis(const ShardSpec& spec, const std::vector<int64_t>& coord, int d);
// Dims [0, end) flattened row-major (the tokens of [batch, seq, features]).
Fp8Axis fp8_leading_axis(const ShardSpec& spec, const std::vector<int64_t>& coord, int end);

// The amax of each scale group, max-reduced over the mesh dims that split the group:
// shape [] (tensorwise), [rows, 1] (rowwise) or [rows, reduction] (mx_block: each element
// gets its block's amax).
at::Tensor fp8_amax(const Fp8Operand& op, Fp8Scaling s, const DeviceMesh& mesh);

// q(op.local) with the scales of `s`; with a history (tensorwise), the delayed amax.
// Scales are [] (tensorwise), [rows, 1] (rowwise) or [rows, reduction] (mx_block). A
// dry-run's meta operand gives meta float32 data and a scale of 1.
Fp8Tensor fp8_quantize(const Fp8Operand& op, Fp8Format f, Fp8Scaling s, const DeviceMesh& mesh,
                       AmaxHistory* history = nullptr);

// deq(q(op.local)): fp8_quantize(...).dequantized().
at::Tensor fp8_fake_quantize(const Fp8Operand& op, Fp8Format f, Fp8Scaling s, const DeviceMesh& mesh,
                             AmaxHistory* history = nullptr);

}  // namespace hp
