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

// Each element's block amax: the local part of every global block, then the blocks'
// maxima over the ranks holding their pieces.
at::Tensor block_amax(const Fp8Operand& op, const DeviceMesh& mesh) {
  const at::Tensor& t = op.local;
  const int64_t blocks = (op.reduction.global_size + kMxBlock - 1) / kMxBlock;
  at::Tensor block = at::floor_divide(op.reduction.index, kMxBlock).to(t.device());
  at::Tensor per_block = at::zeros({t.size(0), blocks}, t.options())
                             .scatter_reduce(1, block.unsqueeze(0).expand_as(t).contiguous(), t.abs(), "amax");
  return max_over(per_block, op.reduction.mesh_dims, mesh).index_select(1, block);
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
  switch (s) {
    case Fp8Scaling::Tensorwise: {
      std::vector<int> dims = op.rows.mesh_dims;
      dims.insert(dims.end(), op.reduction.mesh_dims.begin(), op.reduction.mesh_dims.end());
      std::sort(dims.begin(), dims.end());
      // An empty piece (uneven shards) holds nothing: 0 never wins the max.
      return max_over(t.numel() ? t.abs().amax() : at::zeros({}, t.options()), dims, mesh);
    }
    case Fp8Scaling::Rowwise:
      return max_over(t.size(1) ? t.abs().amax(1, /*keepdim=*/true) : at::zeros({t.size(0), 1}, t.options()),
                      op.reduction.mesh_dims, mesh);
    case Fp8Scaling::MxBlock:
      return block_amax(op, mesh);
  }
  return at::Tensor();
}

at::Tensor fp8_fake_quantize(const Fp8Operand& op, Fp8Format f, Fp8Scaling s, const DeviceMesh& mesh,
                             AmaxHistory* history) {
  at::Tensor amax = fp8_amax(op, s, mesh);
  if (history) amax = history->delayed_amax(amax);
  return fp8_round_trip(op.local, fp8_scale(amax, f, s), f);
}

}  // namespace hp
