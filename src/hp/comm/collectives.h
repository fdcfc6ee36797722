// Collectives on a process group, synchronous and asynchronous (`*_async` returns a
// Pending to wait on). Ranks inside a group are group ranks (0..size-1).
//
// Gloo has no reduce_scatter and no flat all-gather, and its list all-gather is slow;
// both are built on all-to-all, which moves the bytes of a ring.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hp/base/reduce_op.h"
#include "hp/comm/group.h"
#include "hp/comm/pending.h"

namespace hp::comm {

// Sizes of torch.chunk: ceil(n / parts) each, trailing parts short or empty.
std::vector<int64_t> chunk_sizes(int64_t n, int parts);

// Reduces `t` over the group, in place. Avg on integers truncates.
Pending all_reduce_async(at::Tensor t, const Group& g, ReduceOp op = ReduceOp::Sum);
at::Tensor all_reduce_(at::Tensor t, const Group& g, ReduceOp op = ReduceOp::Sum);
at::Tensor all_reduce(const at::Tensor& t, const Group& g, ReduceOp op = ReduceOp::Sum);

// Concatenates every rank's `t` along `dim`. `sizes[r]` is rank r's extent along `dim`
// (empty: all equal to this rank's).
Pending all_gather_async(const at::Tensor& t, const Group& g, int64_t dim = 0,
                         std::vector<int64_t> sizes = {});
at::Tensor all_gather(const at::Tensor& t, const Group& g, int64_t dim = 0,
                      std::vector<int64_t> sizes = {});

// Reduces `t` over the group and leaves rank r the r-th piece along `dim`, of extent
// `sizes[r]` (empty: chunk_sizes(t.size(dim), group size)).
Pending reduce_scatter_async(const at::Tensor& t, const Group& g, int64_t dim = 0,
                             ReduceOp op = ReduceOp::Sum, std::vector<int64_t> sizes = {});
at::Tensor reduce_scatter(const at::Tensor& t, const Group& g, int64_t dim = 0,
                          ReduceOp op = ReduceOp::Sum, std::vector<int64_t> sizes = {});

// Splits `t` along `split_dim` (piece r, of extent split_sizes[r], goes to rank r) and
// concatenates what arrives along `concat_dim` (rank r's piece has extent concat_sizes[r]).
// Empty split_sizes: chunk_sizes; empty concat_sizes: all equal to t.size(concat_dim).
Pending all_to_all_async(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                         std::vector<int64_t> split_sizes = {}, std::vector<int64_t> concat_sizes = {});
at::Tensor all_to_all(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                      std::vector<int64_t> split_sizes = {}, std::vector<int64_t> concat_sizes = {});

// c10d's all_to_all_single: rows (dim 0) of `in` go out in `in_splits` pieces, arrive
// in `out` in `out_splits` pieces; empty splits mean equal pieces.
Pending all_to_all_single_async(at::Tensor out, const at::Tensor& in, const Group& g,
                                std::vector<int64_t> out_splits = {}, std::vector<int64_t> in_splits = {});

// Copies group rank `src`'s `t` into every rank's `t`, in place.
Pending broadcast_async(at::Tensor t, const Group& g, int src = 0);
at::Tensor broadcast_(at::Tensor t, const Group& g, int src = 0);

// Point to point; `peer` is a group rank. recv fills `t` (its shape must match).
Pending send_async(const at::Tensor& t, const Group& g, int peer, int tag = 0);
Pending recv_async(at::Tensor t, const Group& g, int peer, int tag = 0);

void barrier(const Group& g);

}  // namespace hp::comm
