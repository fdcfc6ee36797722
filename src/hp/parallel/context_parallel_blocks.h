// Blockwise attention of this rank's queries over K/V blocks (k and v stacked,
// [2, B, Hkv, L, D], L the length of the owner's share), merged by log-sum-exp, with a
// backward that recomputes each block's probabilities. Ring and allgather_kv differ only in
// how the blocks arrive. Work is planned per pair of tiles of global positions (a query
// tile, a key tile): a key tile wholly before the query tile is attended in full, one
// wholly after is skipped, a tile with itself is masked. Tiles bound what is computed at
// once (kTile x kTile scores per head), so transient memory does not grow with the sequence.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "hp/parallel/context_parallel_kernels.h"

namespace hp::cp {

struct BlockwiseState {
  at::Tensor out, lse;  // [B, Hq, L, D], [B, Hq, L]: the running result and its log-sum-exp
};
BlockwiseState start_blockwise(const at::Tensor& q);
// Merges the attention of the queries over cp rank `owner`'s block into `state`.
void attend_block(const AttentionArgs& a, int owner, const at::Tensor& kv, BlockwiseState& state);
// The gradient of the final result through `owner`'s block: adds the queries' share to `dq`
// and returns the block's dK/dV, stacked as the block.
at::Tensor attend_block_backward(const AttentionArgs& a, int owner, const at::Tensor& kv, const at::Tensor& dout,
                                 const BlockwiseState& final_state, at::Tensor& dq);

// The graph node of a blockwise attention: `backward` maps (dout, q, k, v detached, the
// final state) to dq, dk, dv. Returns the output, linked to q, k and v.
using BlockwiseBackward = std::function<std::vector<at::Tensor>(const at::Tensor& dout, const AttentionArgs& detached,
                                                                const BlockwiseState& final_state)>;
at::Tensor attach_blockwise_backward(const AttentionArgs& a, const BlockwiseState& final_state,
                                     BlockwiseBackward backward, const char* name);

// k and v stacked: [2, B, Hkv, L, D].
at::Tensor stack_kv(const at::Tensor& k, const at::Tensor& v);

}  // namespace hp::cp
