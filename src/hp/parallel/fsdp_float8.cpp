#include "hp/parallel/fsdp_float8.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/tensor/fp8_linear.h"

namespace hp::parallel {
namespace {

// As the FP8 product's: an empty or meta piece holds nothing, and 0 never wins a max.
at::Tensor local_amax(const at::Tensor& t) {
  return t.numel() == 0 || t.is_meta() ? at::zeros({}, t.options()) : t.abs().amax();
}

}  // namespace

Float8Gather::Float8Gather(const std::vector<FSDPParam>& params, const std::vector<nn::Linear*>& linears,
                           at::ScalarType compute_dtype) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Fp8Linear* layer = linears[i] ? linears[i]->product().target<Fp8Linear>() : nullptr;
    if (!layer || !layer->options().enable_fsdp_float8_all_gather) continue;
    HP_CHECK(compute_dtype == at::kFloat)
        << "fully_shard: FP8 all-gather of '" << params[i].name() << "' dequantizes into the float32 weight the FP8 "
        << "linear takes; mp_policy.param_dtype = " << compute_dtype << " would round it again";
    layer->precast_weight().storage = params[i].unsharded_storage();
    cast_.push_back(i);
    layers_.push_back(layer);
    const ShardSpec& spec = params[i].unsharded_spec();
    for (int d = 0; d < spec.ndim(); ++d)
      for (int k : spec.mesh_dims_sharding(d))
        if (std::find(mesh_dims_.begin(), mesh_dims_.end(), k) == mesh_dims_.end()) mesh_dims_.push_back(k);
  }
  std::sort(mesh_dims_.begin(), mesh_dims_.end());  // the same order on every rank
}

at::ScalarType Float8Gather::dtype(size_t i, at::ScalarType compute) const {
  return std::count(cast_.begin(), cast_.end(), i) ? fp8_dtype(Fp8Format::E4M3) : compute;
}

std::vector<at::Tensor> Float8Gather::scales(const std::vector<FSDPParam>& params, const comm::Group& shard,
                                             bool forward) {
  std::vector<at::Tensor> out(params.size());
  if (cast_.empty()) return out;
  if (forward || !amax_.defined()) {
    std::vector<at::Tensor> local;
    for (size_t i : cast_) local.push_back(local_amax(params[i].sharded().to_local().detach()));
    at::Tensor amax = comm::all_reduce(at::stack(local), shard, ReduceOp::Max);
    const DeviceMesh& mesh = params[cast_[0]].sharded().device_mesh();
    for (int k : mesh_dims_) amax = comm::all_reduce(amax, mesh.group(k), ReduceOp::Max);
    if (!amax.is_meta()) {
      std::vector<at::Tensor> used;
      for (size_t j = 0; j < cast_.size(); ++j) {
        AmaxHistory* history = layers_[j]->histories().weight.get();
        used.push_back(history ? history->delayed_amax(amax[j]) : amax[j]);
      }
      amax = at::stack(used);
    }
    amax_ = amax;
  }
  // A dry-run (meta tensors) needs the collectives and shapes, no values (where has no meta kernel).
  const at::Tensor scale = amax_.is_meta() ? at::empty_like(amax_) : fp8_scale(amax_, Fp8Format::E4M3, Fp8Scaling::Tensorwise);
  for (size_t j = 0; j < cast_.size(); ++j) {
    out[cast_[j]] = scale[j];
    layers_[j]->precast_weight().scale = scale[j];
  }
  return out;
}

}  // namespace hp::parallel
