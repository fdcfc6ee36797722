#include "hp/nn/token_dispatcher.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "hp/base/error.h"

namespace hp::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// index_select and index_copy keep for their backward only the index (ATen's index_copy
// would keep its whole source, the experts' outputs, for its shape). Meta tensors (a
// dry-run) have no index kernels: there, storage of the shapes the kernels allocate.
struct SelectRows : torch::autograd::Function<SelectRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& index) {
    ctx->save_for_backward({index});
    ctx->saved_data["rows"] = x.size(0);
    return x.is_meta() ? at::empty({index.size(0), x.size(1)}, x.options()) : x.index_select(0, index);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad = grads[0];
    const at::Tensor index = ctx->get_saved_variables()[0];
    at::Tensor dx = at::zeros({ctx->saved_data["rows"].toInt(), grad.size(1)}, grad.options());
    if (!grad.is_meta()) dx.index_add_(0, index, grad);  // as ATen's index_select backward
    return {dx, at::Tensor()};
  }
};

struct PlaceRows : torch::autograd::Function<PlaceRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& src, const at::Tensor& index, int64_t rows) {
    ctx->save_for_backward({index});
    at::Tensor out = at::zeros({rows, src.size(1)}, src.options());
    return src.is_meta() ? out : out.index_copy_(0, index, src);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& grad = grads[0];
    const at::Tensor index = ctx->get_saved_variables()[0];
    at::Tensor dsrc = grad.is_meta() ? at::empty({index.size(0), grad.size(1)}, grad.options())
                                     : grad.index_select(0, index);
    return {dsrc, at::Tensor(), at::Tensor()};
  }
};

// Autograd's product rule would hold two [T, top_k, D] gradients at once (the outputs', and
// the product the weights' gradient reduces), the largest tensors of a MoE layer's
// backward; this backward reduces the weights' first, then makes the outputs'. The same
// ops as the product rule's, so the same bits.
struct WeightedChoices : torch::autograd::Function<WeightedChoices> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& outputs, const at::Tensor& weights) {
    ctx->save_for_backward({outputs, weights});
    return (outputs * weights.unsqueeze(-1)).sum(1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].unsqueeze(1);
    at::Tensor grad_weights = ctx->needs_input_grad(1) ? (grad * saved[0]).sum(-1) : at::Tensor();
    at::Tensor grad_outputs = ctx->needs_input_grad(0) ? grad * saved[1].unsqueeze(-1) : at::Tensor();
    return {grad_outputs, grad_weights};
  }
};

}  // namespace

at::Tensor select_rows(const at::Tensor& x, const at::Tensor& index) { return SelectRows::apply(x, index); }

at::Tensor place_rows(const at::Tensor& src, const at::Tensor& index, int64_t rows) {
  return PlaceRows::apply(src, index, rows);
}

at::Tensor weighted_sum_of_choices(const at::Tensor& outputs, const at::Tensor& weights) {
  return WeightedChoices::apply(outputs, weights);
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
