// Micro-pipelined tensor parallelism (PyTorch's "async TP"): the sequence-parallel
// collectives around a Linear split into one piece per tensor-parallel rank, so that
// pieces travel while other pieces multiply.
//
//   all-gather + matmul (ColwiseParallel on a sequence-sharded input): each rank sends its
//     sequence piece to every peer and multiplies the piece it holds while the others
//     arrive, then each arrived piece in turn. Backward: the input gradient's
//     reduce-scatter runs behind the weight-gradient matmul; the gathered input is kept
//     from forward. Linears that read the same input (q, k, v; gate, up) gather it once.
//   matmul + reduce-scatter (RowwiseParallel to Shard(seq)): the rows bound for each peer
//     are multiplied and sent at once, the next peer's first; each rank sums what it
//     receives in rank order. Backward: the output gradient's pieces arrive while the
//     input-gradient rows of the pieces already here are computed.
//
// The same products row for row and the same sums in the same order as the synchronous
// path, so results are bitwise equal wherever the BLAS computes a block of rows as it
// computes those rows of the whole product (not for the tiniest products; see
// tests/parallel/async_tp_test.cpp).
#pragma once

#include "hp/nn/layers.h"

namespace hp {

// Products for nn::Linear::set_product. `tp_dim`: the tensor-parallel mesh dim of the
// parameters' mesh. An input not laid out as the decomposition needs (or meta tensors of a
// dry run) takes the ordinary path: redistribute, then hp::linear.
nn::Linear::Product all_gather_linear(int tp_dim, int seq_dim = 1);      // input Shard(seq) -> output Shard(-1)
nn::Linear::Product linear_reduce_scatter(int tp_dim, int seq_dim = 1);  // input Shard(-1) -> output Shard(seq)

// Is `product` one of these? A product set later (FP8's) replaces it, and the Linear then
// takes its input whole again.
bool is_async_tp_product(const nn::Linear::Product& product);

}  // namespace hp
