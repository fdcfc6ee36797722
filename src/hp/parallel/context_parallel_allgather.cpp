// allgather_kv: K and V are gathered whole (one all-gather of both); the local queries
// attend over them blockwise (context_parallel_blocks.h), so no score matrix over the
// whole sequence is ever held. The backward recomputes the probabilities block by block
// and reduce-scatters the gathered dK/dV.
#include <ATen/ATen.h>

#include "hp/comm/collectives.h"
#include "hp/parallel/context_parallel_blocks.h"

namespace hp::cp {

at::Tensor allgather_kv_attention(const AttentionArgs& a) {
  const comm::Group& g = *a.group;
  const int cp = g.size();
  std::vector<int64_t> offset(cp + 1, 0);
  for (int r = 0; r < cp; ++r) offset[r + 1] = offset[r] + a.lengths[r];
  BlockwiseState state = start_blockwise(a.q);
  {
    at::NoGradGuard no_grad;
    const at::Tensor kv = comm::all_gather(stack_kv(a.k, a.v), g, 3, a.lengths);  // [2, B, Hkv, S, D]
    for (int owner = 0; owner < cp; ++owner) attend_block(a, owner, kv.narrow(3, offset[owner], a.lengths[owner]), state);
  }
  return attach_blockwise_backward(a, state, [offset](const at::Tensor& dout, const AttentionArgs& a,
                                                      const BlockwiseState& state) -> std::vector<at::Tensor> {
    const comm::Group& g = *a.group;
    const int cp = g.size();
    const at::Tensor kv = comm::all_gather(stack_kv(a.k, a.v), g, 3, a.lengths);  // gathered again, not kept
    at::Tensor dq = at::zeros_like(a.q), dkv = at::zeros_like(kv);
    for (int owner = 0; owner < cp; ++owner)
      dkv.narrow(3, offset[owner], a.lengths[owner])
          .copy_(attend_block_backward(a, owner, kv.narrow(3, offset[owner], a.lengths[owner]), dout, state, dq));
    at::Tensor mine = comm::reduce_scatter(dkv, g, 3, ReduceOp::Sum, a.lengths);
    return {dq, mine[0], mine[1]};
  }, "AllGatherKVAttentionBackward");
}

}  // namespace hp::cp
