// fully_shard's FP8 all-gather: the weights of a unit's FP8 Linears that ask for it
// (enable_fsdp_float8_all_gather, tensorwise) travel as E4M3 with their scales, one byte an
// element against bf16's two; the unit's other parameters travel in their own dtype in the
// same byte buffer, so a unit still makes one all-gather (as PyTorch's FSDP packs mixed
// dtypes into one uint8 buffer).
//
// The product must see exactly the deq(q(W)) it would compute from the whole weight, so the
// scale is the whole weight's: a forward gather reduces the local amaxes of all the unit's
// cast weights in one max all-reduce over the shard group (then one over each mesh dim that
// splits these weights, such as tensor parallelism's), and with delayed scaling takes the
// amax from the layer's weight history. The backward gather of the same step reuses those
// scales: the master weights have not changed, and a history records once per forward, as
// without fully_shard. (Parameters kept gathered across forwards, reshard_after_backward
// off or recomputation, skip a forward gather and so a delayed record.)
//
// Each shard is cast with that scale (fp8_cast) and each gathered piece dequantized into
// the float32 unsharded weight (fp8_dequantize): elementwise, so this is fp8_round_trip of
// the whole weight bit for bit. The layer learns which storage holds its cast weight and
// takes it as its quantized operand, not quantizing it again.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hp/comm/group.h"
#include "hp/nn/layers.h"
#include "hp/parallel/fsdp_param.h"

namespace hp {
class Fp8Linear;
}

namespace hp::parallel {

class Float8Gather {
 public:
  // `linears[i]`: the Linear whose weight params[i] is, or null. Reads the Linears' products
  // now (a unit makes this at its first gather, when they are set).
  Float8Gather(const std::vector<FSDPParam>& params, const std::vector<nn::Linear*>& linears,
               at::ScalarType compute_dtype);

  bool empty() const { return cast_.empty(); }
  // The dtype parameter i travels in: E4M3 when cast, else `compute`.
  at::ScalarType dtype(size_t i, at::ScalarType compute) const;
  // Per parameter, the 0-dim float32 scale to cast it with; undefined for the others.
  std::vector<at::Tensor> scales(const std::vector<FSDPParam>& params, const comm::Group& shard, bool forward);

 private:
  std::vector<size_t> cast_;             // indices of the cast parameters
  std::vector<const Fp8Linear*> layers_;  // their layers
  std::vector<int> mesh_dims_;           // mesh dims, other than the shard dim, splitting any of them
  at::Tensor amax_;                      // [cast_.size()]: the last forward gather's
};

}  // namespace hp::parallel
