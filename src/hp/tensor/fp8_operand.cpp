#include "hp/tensor/fp8_operand.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"

namespace hp {
namespace {

at::Tensor positions(int64_t offset, int64_t length) {
  return at::arange(offset, offset + length, at::TensorOptions().dtype(at::kLong));
}

at::Tensor max_over(at::Tensor amax, const std::vector<int>& mesh_dims, const DeviceMesh& mesh) {
  for (int k : mesh_dims) amax = comm::all_reduce(amax.contiguous(), mesh.group(k), ReduceOp::Max);
  return amax;
}

// Each block's amax over its local part, [rows, blocks of the whole reduction dim].
at::Tensor local_block_amax(const Fp8Operand& op, const at::Tensor& block) {
  const at::Tensor& t = op.local;
  const int64_t blocks = (op.reduction.global_size + kMxBlock - 1) / kMxBlock;
  at::Tensor per_block = at::zeros({t.size(0), blocks}, t.options());
  if (t.is_meta()) return per_block;  // abs and scatter_reduce have no C++ meta kernel
  return per_block.scatter_reduce(1, block.unsqueeze(0).expand_as(t).contiguous(), t.abs(), "amax");
}

// The local amax of each scale group, shaped as the collective that completes it.
at::Tensor local_amax(const Fp8Operand& op, Fp8Scaling s, const at::Tensor& block) {
  const at::Tensor& t = op.local;
  const bool empty = t.numel() == 0 || t.is_meta();  // an empty piece holds nothing: 0 never wins
  switch (s) {
    case Fp8Scaling::Tensorwise: return empty ? at::zeros({}, t.options()) : t.abs().amax();
    case Fp8Scaling::Rowwise: return empty ? at::zeros({t.size(0), 1}, t.options()) : t.abs().amax(1, true);
    case Fp8Scaling::MxBlock: return local_block_amax(op, block);
  }
  return at::Tensor();
}

// The mesh dims whose ranks hold pieces of one scale group.
std::vector<int> group_mesh_dims(const Fp8Operand& op, Fp8Scaling s) {
  std::vector<int> dims = op.reduction.mesh_dims;
  if (s == Fp8Scaling::Tensorwise) dims.insert(dims.end(), op.rows.mesh_dims.begin(), op.rows.mesh_dims.end());
  std::sort(dims.begin(), dims.end());
  return dims;
}

}  // namespace

Fp8Axis fp8_axis(const ShardSpec& spec, const std::vector<int64_t>& coord, int d) {
  return {spec.mesh_dims_sharding(d), positions(spec.global_offset(coord)[d], spec.local_shape(coord)[d]),
          spec.shape()[d]};
}

Fp8Axis fp8_leading_axis(const ShardSpec& spec, const std::vector<int64_t>& coord, int end) {
  Fp8Axis axis{{}, positions(0, 1), 1};
  for (int d = 0; d < end; ++d) {
    Fp8Axis a = fp8_axis(spec, coord, d);
    axis.index = (axis.index.unsqueeze(1) * a.global_size + a.index.unsqueeze(0)).flatten();
    axis.global_size *= a.global_size;
    for (int k : a.mesh_dims)
      if (std::find(axis.mesh_dims.begin(), axis.mesh_dims.end(), k) == axis.mesh_dims.end())
        axis.mesh_dims.push_back(k);
  }
  std::sort(axis.mesh_dims.begin(), axis.mesh_dims.end());
  return axis;
}

at::Tensor fp8_amax(const Fp8Operand& op, Fp8Scaling s, const DeviceMesh& mesh) {
  const at::Tensor& t = op.local;
  HP_CHECK(t.dim() == 2) << "an FP8 operand is a [rows, reduction] matrix, got " << t.dim() << " dims";
  const at::Tensor block = at::floor_divide(op.reduction.index, kMxBlock).to(t.device());
  at::Tensor amax = max_over(local_amax(op, s, block), group_mesh_dims(op, s), mesh);
  if (s != Fp8Scaling::MxBlock) return amax;
  // Each element gets its block's amax (index_select has no C++ meta kernel).
  return t.is_meta() ? at::empty_like(t) : amax.index_select(1, block);
}

Fp8Tensor fp8_quantize(const Fp8Operand& op, Fp8Format f, Fp8Scaling s, const DeviceMesh& mesh,
                       AmaxHistory* history) {
  at::Tensor amax = fp8_amax(op, s, mesh);
  // A dry-run (meta tensors) needs the collectives above and the shape, no values.
  if (op.local.is_meta()) return {at::empty_like(op.local), at::ones({}, op.local.options())};
  if (history) amax = history->delayed_amax(amax);
  return fp8_cast(op.local, fp8_scale(amax, f, s), f);
}

at::Tensor fp8_fake_quantize(const Fp8Operand& op, Fp8Format f, Fp8Scaling s, const DeviceMesh& mesh,
                             AmaxHistory* history) {
  return fp8_quantize(op, f, s, mesh, history).dequantized();
}

}  // namespace hp
