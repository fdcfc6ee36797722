// allgather_kv: K and V are gathered whole (one all-gather of both); local queries attend
// over them. The backward reduce-scatters their gradients.
#include <ATen/ATen.h>

#include "hp/comm/autograd.h"
#include "hp/parallel/context_parallel_kernels.h"
#include "hp/tensor/meta_ops.h"

namespace hp::cp {

at::Tensor allgather_kv_attention(const AttentionArgs& a) {
  const comm::Group& g = *a.group;
  at::Tensor kv = comm::autograd::all_gather(at::stack({a.k, a.v}), g, 3, a.lengths);  // [2, B, Hkv, S, D]
  at::Tensor q_pos = positions_of(a.runs[g.rank()]);
  at::Tensor k_pos = positions_of_all(a.runs);
  return attention(a.q, kv[0], kv[1], causal_mask(q_pos, k_pos, a.causal, a.q), false, a.scale);
}

}  // namespace hp::cp
