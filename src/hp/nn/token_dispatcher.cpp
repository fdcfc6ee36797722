#include "hp/nn/token_dispatcher.h"

#include <ATen/ATen.h>

#include <cmath>

#include "hp/base/error.h"

namespace hp::nn {
namespace {

// A dry-run's stand-in for gathered or placed rows: linked to x for autograd, and new
// storage as the real index_select's or index_copy's, so that its bytes count.
at::Tensor linked_rows(const at::Tensor& x, int64_t rows) {
  return (x.sum(0, true) * 0).expand({rows, x.size(1)}).contiguous();
}

}  // namespace

at::Tensor select_rows(const at::Tensor& x, const at::Tensor& index) {
  return x.is_meta() ? linked_rows(x, index.size(0)) : x.index_select(0, index);
}

at::Tensor place_rows(const at::Tensor& src, const at::Tensor& index, int64_t rows) {
  if (src.is_meta()) return linked_rows(src, rows);
  return at::zeros({rows, src.size(1)}, src.options()).index_copy(0, index, src);
}

DispatchedTokens TokenDispatcher::dispatch(const at::Tensor& tokens, const at::Tensor& indices, int64_t num_experts) {
  at::Tensor sorted = sort(tokens, indices, num_experts);
  return exchange(sorted, per_expert_);
}

at::Tensor TokenDispatcher::sort(const at::Tensor& tokens, const at::Tensor& indices, int64_t num_experts) {
  HP_CHECK(tokens.dim() == 2 && indices.dim() == 2 && indices.size(0) == tokens.size(0))
      << "dispatch needs tokens [T, D] and indices [T, top_k], got " << tokens.sizes() << " and " << indices.sizes();
  num_tokens_ = tokens.size(0);
  top_k_ = indices.size(1);
  assignments_ = num_tokens_ * top_k_;
  if (tokens.is_meta()) return sort_even(tokens, num_experts);
  at::Tensor flat = indices.reshape({-1}).to(at::kLong).cpu();
  at::Tensor order = at::argsort(flat, /*stable=*/true);  // by expert, token order within one
  at::Tensor counts = at::bincount(flat, {}, num_experts);
  std::vector<int64_t> per_expert(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + num_experts);
  dropped_ = 0;
  if (options_.capacity_factor > 0) {
    // The first `capacity` assignments of each expert, in token order, are kept.
    const int64_t capacity = capacity_of(num_experts);
    std::vector<int64_t> keep;
    keep.reserve(assignments_);
    const int64_t* o = order.data_ptr<int64_t>();
    int64_t start = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t take = std::min(per_expert[e], capacity);
      keep.insert(keep.end(), o + start, o + start + take);
      dropped_ += per_expert[e] - take;
      start += per_expert[e];
      per_expert[e] = take;
    }
    order = at::tensor(keep, at::kLong);
  }
  kept_ = order.to(tokens.device());
  per_expert_ = std::move(per_expert);
  return select_rows(tokens, sorted_token_ids());
}

at::Tensor TokenDispatcher::sorted_token_ids() const { return at::floor_divide(kept_, top_k_); }

int64_t TokenDispatcher::capacity_of(int64_t num_experts) const {
  return static_cast<int64_t>(std::ceil(options_.capacity_factor * double(assignments_) / double(num_experts)));
}

at::Tensor TokenDispatcher::sort_even(const at::Tensor& tokens, int64_t num_experts) {
  std::vector<int64_t> per_expert(num_experts, assignments_ / num_experts);
  for (int64_t e = 0; e < assignments_ % num_experts; ++e) ++per_expert[e];
  dropped_ = 0;
  int64_t kept = 0;
  for (int64_t& n : per_expert) {
    if (options_.capacity_factor > 0) {
      const int64_t take = std::min(n, capacity_of(num_experts));
      dropped_ += n - take;
      n = take;
    }
    kept += n;
  }
  kept_ = at::empty({kept}, tokens.options().dtype(at::kLong));
  per_expert_ = std::move(per_expert);
  return select_rows(tokens, kept_);
}

at::Tensor TokenDispatcher::combine(const at::Tensor& expert_out) { return unsort(exchange_back(expert_out)); }

at::Tensor TokenDispatcher::run_experts(const at::Tensor& sorted, const ExpertFunction& experts,
                                        const std::function<void()>& behind_exchange) {
  DispatchedTokens in = exchange(sorted, per_expert_);
  at::Tensor back = exchange_back(experts.run(in.tokens, in.tokens_per_expert, experts.weights));
  if (behind_exchange) behind_exchange();
  return back;
}

at::Tensor TokenDispatcher::unsort(const at::Tensor& back) {
  return place_rows(back, kept_, assignments_).reshape({num_tokens_, top_k_, back.size(1)});
}

DispatchedTokens TokenDispatcher::exchange(const at::Tensor& sorted, const std::vector<int64_t>& tokens_per_expert) {
  return {sorted, tokens_per_expert};
}

at::Tensor TokenDispatcher::exchange_back(const at::Tensor& expert_out) { return expert_out; }

}  // namespace hp::nn
