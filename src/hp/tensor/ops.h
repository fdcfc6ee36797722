// DTensor ops. Each looks up its sharding rule (cached by input specs), redistributes the
// inputs to the cheapest accepted layouts, runs the local ATen op and wraps the result.
//
// Gradients keep one convention: the local gradient of a piece is that piece of the whole
// gradient, and for Replicate or Partial pieces it is the whole gradient. When a
// replicated input meets work split over a mesh dim, its local gradient is only a partial
// sum, so the op all-reduces it in backward over that mesh dim.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "hp/layout/sharding_rules.h"
#include "hp/tensor/dtensor.h"

namespace hp {

struct LocalContext {
  const std::vector<ShardSpec>& inputs;  // the layouts the inputs were given
  const ShardSpec& output;
  const std::vector<int64_t>& coord;     // this rank's mesh coordinate
};
using LocalKernel = std::function<at::Tensor(const std::vector<at::Tensor>&, const LocalContext&)>;

// The general form every op below is made of.
DTensor dispatch(const Op& op, const std::vector<DTensor>& inputs, const LocalKernel& kernel);

DTensor add(const DTensor& a, const DTensor& b);
DTensor sub(const DTensor& a, const DTensor& b);
DTensor mul(const DTensor& a, const DTensor& b);
DTensor matmul(const DTensor& a, const DTensor& b);
DTensor linear(const DTensor& x, const DTensor& weight);  // x @ weight^T
// The label of linear()'s op, whose kernel is at::linear(x, weight): a full checkpoint's
// recompute may give its node without its product (memory/region_ops.h), and token chunks
// may split its rows (memory/token_chunk_check.h). Other kernels under Op::linear() carry
// other labels ("fp8_linear") or none.
extern const char* const kAtLinearLabel;
DTensor sum(const DTensor& x, std::vector<int64_t> dims, bool keepdim = false);
DTensor mean(const DTensor& x, std::vector<int64_t> dims, bool keepdim = false);
DTensor softmax(const DTensor& x, int64_t dim);
DTensor log_softmax(const DTensor& x, int64_t dim);
// table [V, D] (vocab-sharded or not) looked up by integer ids [...] -> [..., D].
DTensor embedding(const DTensor& table, const DTensor& ids);
DTensor view(const DTensor& x, std::vector<int64_t> shape);
DTensor transpose(const DTensor& x, int64_t a, int64_t b);
DTensor permute(const DTensor& x, std::vector<int64_t> dims);
DTensor flatten(const DTensor& x, int64_t start = 0, int64_t end = -1);
DTensor unflatten(const DTensor& x, int64_t dim, std::vector<int64_t> sizes);  // one -1 allowed
// The max over `dims` (all when empty), values only. Over a sharded dim each rank keeps its
// local max (Partial(max)) and its gradient goes only where that is the global max (a tie
// across ranks gives each tied rank the whole gradient, unlike ATen's even split).
DTensor amax(const DTensor& x, std::vector<int64_t> dims, bool keepdim = false);
// Inputs sharded on other dims keep their shards; a shard on `dim` is gathered first.
DTensor cat(const std::vector<DTensor>& tensors, int64_t dim);
DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length);
// Pieces of the given sizes along `dim` (they must add up to its size), as ATen's
// split_with_sizes; chunk gives pieces of ceil(size / n), as ATen's chunk.
std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<DTensor> chunk(const DTensor& x, int64_t n, int64_t dim);
// An elementwise function of one tensor (relu, silu, x * 2, ...).
DTensor map(const DTensor& x, const std::function<at::Tensor(const at::Tensor&)>& fn);

// Softmax attention of q [B, Hq, Sq, D] over k [B, Hkv, Sk, D] and v [B, Hkv, Sk, Dv]
// (grouped-query when Hq is a multiple of Hkv), through at::scaled_dot_product_attention,
// scaled by 1/sqrt(D) unless `scale` is given. With `causal`, the query at global position
// i sees keys 0..i. Batch or heads may be sharded, query positions too (keys stay whole).
DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v, bool causal,
                                     std::optional<double> scale = std::nullopt);

DTensor rms_norm(const DTensor& x, const DTensor& weight, double eps = 1e-6);
// SwiGLU's silu(gate) * up.
DTensor swiglu(const DTensor& gate, const DTensor& up);
// The same on local tensors: one pass where hp::fused serves them, else ATen's two ops.
at::Tensor swiglu_local(const at::Tensor& gate, const at::Tensor& up);
DTensor layer_norm(const DTensor& x, const DTensor& weight, const DTensor& bias, double eps = 1e-5);

// Mean cross-entropy of logits [..., V] against integer targets [...] (all rows: [N, V] and
// [N], or [B, S, V] and [B, S]). Rows sharded on any dim stay sharded (a sequence sharded by
// context parallelism), their sums reduced. Logits sharded over the vocabulary (last dim)
// stay sharded: a max, a sum of exponentials and the target logit are reduced across the
// shards instead of gathering the logits (loss parallel).
DTensor cross_entropy(const DTensor& logits, const DTensor& targets);

}  // namespace hp
