#include "hp/nn/moe.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "hp/base/error.h"
#include "hp/base/runs.h"
#include "hp/base/strings.h"
#include "hp/comm/autograd.h"
#include "hp/comm/collectives.h"
#include "hp/tensor/op_observer.h"
#include "hp/tensor/ops.h"
#include "hp/tensor/recompute_scope.h"

namespace hp::nn {
namespace {

// The mesh dims over which `x`'s rows (dim 0) are split: each rank holds other tokens.
std::vector<int> row_split_dims(const DTensor& x) {
  std::vector<int> dims;
  for (int k = 0; k < x.device_mesh().ndim(); ++k)
    if (x.placements()[k].is_shard() && x.placements()[k].dim() == 0) dims.push_back(k);
  return dims;
}

// A parameter's local tensor for a local computation on tokens laid out as `tokens`, with
// the gradient convention of hp::dispatch: a replicated parameter meeting split tokens
// gets its partial gradients summed (unless a data-parallel wrapper reduces them later); a
// deferred one meeting replicated tokens is scaled so that the wrapper's sum restores it.
at::Tensor local_parameter(const DTensor& p, const std::vector<Placement>& tokens) {
  at::Tensor w = p.to_local();
  const DeviceMesh& mesh = p.device_mesh();
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (!p.placements()[k].is_replicate() || !w.requires_grad()) continue;
    const bool split = tokens[k].is_shard();
    const bool deferred = p.defers_grad_reduction(k);
    if (split && !deferred) w = comm::autograd::all_reduce_sum_backward(w, mesh.group(k));
    if (!split && deferred) {
      const double factor = 1.0 / double(mesh.size(k));
      w = comm::autograd::attach_backward(w.detach(), w, [factor](const at::Tensor& g) { return g * factor; },
                                          "ScaleBackward");
    }
  }
  return w;
}

bool grouped_kernel_takes(const at::Tensor& x, const at::Tensor& w) {
  const auto t = x.scalar_type();
  if (t != at::kFloat && t != at::kBFloat16 && t != at::kHalf) return false;
  // The kernel wants 16-byte aligned row strides on both operands.
  const int64_t align = 16 / x.element_size();
  return x.size(0) > 0 && w.size(0) > 0 && x.size(1) % align == 0 && w.size(2) % align == 0;
}

}  // namespace

at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts) {
  HP_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(1) && int64_t(counts.size()) == w.size(0))
      << "grouped_mm needs x [N, K], w [G, K, M] and G counts, got " << x.sizes() << ", " << w.sizes() << " and "
      << counts.size() << " counts";
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  HP_CHECK(total == x.size(0)) << "grouped_mm: counts add up to " << total << ", x has " << x.size(0) << " rows";
  if (!x.is_meta() && grouped_kernel_takes(x, w)) {
    std::vector<int32_t> ends;
    int64_t end = 0;
    for (int64_t c : counts) ends.push_back(static_cast<int32_t>(end += c));
    at::Tensor offs = at::tensor(ends, at::TensorOptions().dtype(at::kInt)).to(x.device());
    return at::_grouped_mm(x.contiguous(), w, offs);
  }
  // A dry-run: the kernel's shapes, and its backward's ([N, K] for x, [G, K, M] for w), by
  // one product; the split below would make each group a gradient of x's whole size.
  if (x.is_meta() && w.size(0) > 0) return x.matmul(w.select(0, 0));
  // No experts here: zeros still linked to x and w, so that every rank runs the same
  // backward collectives (an all-to-all whose output gets no gradient would be skipped).
  if (w.size(0) == 0) return x.matmul(w.new_zeros({w.size(1), w.size(2)})) + w.sum() * 0;
  std::vector<at::Tensor> pieces;
  // One unbind, whose backward stacks the groups' gradients once: w[g] would give each group
  // a gradient of w's whole size, zeros but its slice, summed over the groups.
  const std::vector<at::Tensor> groups = w.unbind(0);
  int64_t start = 0;
  for (size_t g = 0; g < counts.size(); ++g) {  // empty groups too: every group gets a (zero) gradient
    pieces.push_back(x.narrow(0, start, counts[g]).matmul(groups[g]));
    start += counts[g];
  }
  return at::cat(pieces, 0);
}

TokenChoiceTopKRouter::TokenChoiceTopKRouter(int64_t dim, const MoEOptions& options, const DeviceMesh& mesh)
    : o_(options), gate_(register_module("gate", std::make_shared<Linear>(dim, options.num_experts, mesh))) {
  o_.validate();
  expert_bias_ = &register_buffer(
      "expert_bias", DTensor(at::zeros({o_.num_experts}, tensor_options(mesh)), mesh,
                             make_spec({o_.num_experts}, at::kFloat, mesh, std::vector<Placement>(mesh.ndim(), Replicate()))));
  pending_counts_ = at::zeros({o_.num_experts}, tensor_options(mesh));
}

DTensor TokenChoiceTopKRouter::forward(const DTensor& x) {
  DTensor logits = (*gate_)(x);
  return map(logits, [this](const at::Tensor& t) { return o_.score_func == "softmax" ? t.softmax(-1) : t.sigmoid(); });
}

Routing TokenChoiceTopKRouter::route(const DTensor& x) {
  HP_CHECK(x.dim() == 2) << "router needs tokens [T, D], got " << to_string_list(x.sizes());
  for (int k = 0; k < x.device_mesh().ndim(); ++k)
    HP_CHECK(!x.placements()[k].is_shard() || x.placements()[k].dim() == 0)
        << "router needs whole token rows, got layout " << to_string_list(x.placements());
  DTensor scores = (*this)(x);  // [T, E]
  const at::Tensor probs = scores.to_local();
  const int64_t n = probs.size(0), e = o_.num_experts;

  at::Tensor select = probs.detach().to(at::kFloat);
  if (o_.load_balance_bias) select = select + expert_bias();
  if (o_.num_expert_groups > 0) {
    // A group's score: its best expert (softmax) or its best two (sigmoid, DeepSeek-V3).
    const int64_t g = o_.num_expert_groups, per = e / g;
    at::Tensor grouped = select.view({n, g, per});
    at::Tensor group_score = o_.score_func == "sigmoid" && per >= 2
                                 ? std::get<0>(grouped.topk(2, -1)).sum(-1)
                                 : grouped.amax(-1);
    at::Tensor best = std::get<1>(group_score.topk(o_.num_limited_groups, -1));
    at::Tensor keep = at::zeros({n, g}, select.options().dtype(at::kBool)).scatter(1, best, true);
    select = select.masked_fill(~keep.unsqueeze(-1).expand({n, g, per}).reshape({n, e}),
                                -std::numeric_limits<float>::infinity());
  }
  Routing r;
  r.indices = std::get<1>(select.topk(o_.top_k, -1));
  r.weights = probs.gather(1, r.indices);
  if (o_.route_norm) r.weights = r.weights / (r.weights.sum(-1, true) + 1e-20);
  if (o_.route_scale != 1.0) r.weights = r.weights * o_.route_scale;

  at::Tensor chosen = at::zeros({n, e}, probs.options().dtype(at::kFloat)).scatter(1, r.indices, 1.0);
  if (!recomputing()) pending_counts_ += chosen.sum(0);  // a checkpoint's recompute routes the same tokens again
  mesh_ = x.device_mesh();
  split_dims_ = row_split_dims(x);

  if (o_.aux_loss_coef > 0) {
    // Sums over split rows are partial sums; AuxLoss reduces them when the loss is read.
    r.aux_sums = cat({sum(DTensor(chosen.to(probs.scalar_type()), scores.device_mesh(), scores.spec()), {0}),
                      sum(scores, {0})},
                     0);
    const double t = double(x.size(0));
    r.aux_scale = o_.aux_loss_coef * double(e) / (t * t * double(o_.top_k));
  }
  return r;
}

std::vector<at::Tensor> TokenChoiceTopKRouter::take_tokens_per_expert(
    const std::vector<TokenChoiceTopKRouter*>& routers) {
  std::vector<at::Tensor> counts;
  for (TokenChoiceTopKRouter* r : routers) {
    counts.push_back(r->pending_counts_.clone());
    r->pending_counts_.zero_();
  }
  auto alike = [&](size_t i, size_t j) {
    const TokenChoiceTopKRouter &a = *routers[i], &b = *routers[j];
    return a.mesh_ && b.mesh_ && *a.mesh_ == *b.mesh_ && a.split_dims_ == b.split_dims_;
  };
  for_each_run(routers.size(), alike, [&](size_t first, size_t end) {  // one all-reduce per run
    const TokenChoiceTopKRouter& r = *routers[first];
    if (!r.mesh_ || r.split_dims_.empty()) return;
    std::vector<at::Tensor> parts(counts.begin() + first, counts.begin() + end);
    at::Tensor all = at::cat(parts);
    for (int k : r.split_dims_) comm::all_reduce_(all, r.mesh_->group(k));
    for (size_t i = first, offset = 0; i < end; offset += counts[i].numel(), ++i)
      counts[i] = all.narrow(0, offset, counts[i].numel());
  });
  return counts;
}

void TokenChoiceTopKRouter::update_expert_bias(const at::Tensor& loads) {
  expert_bias_->to_local().add_(o_.bias_update_rate * at::sign(loads.mean() - loads));
}

GroupedExperts::GroupedExperts(int64_t dim, int64_t hidden_dim, int64_t num_experts, const DeviceMesh& mesh)
    : w1_(&register_parameter("w1", init_parameter({num_experts, hidden_dim, dim}, mesh, 1.0 / std::sqrt(double(dim))))),
      w2_(&register_parameter("w2", init_parameter({num_experts, dim, hidden_dim}, mesh,
                                                   1.0 / std::sqrt(double(hidden_dim))))),
      w3_(&register_parameter("w3", init_parameter({num_experts, hidden_dim, dim}, mesh,
                                                   1.0 / std::sqrt(double(dim))))) {}

at::Tensor GroupedExperts::run(const at::Tensor& tokens, const std::vector<int64_t>& tokens_per_expert,
                               const std::vector<Placement>& token_layout) {
  // Through the module's hooks, so that wrappers (fully_shard) see the call. The tokens of
  // each rank differ in number: wrapped as this rank's own whole tensor.
  const DeviceMesh& mesh = w1_->device_mesh();
  grouping_ = Grouping{tokens_per_expert, token_layout, nullptr, {}};
  DTensor in(tokens, mesh,
             make_spec(tokens.sizes().vec(), tokens.scalar_type(), mesh, std::vector<Placement>(mesh.ndim(), Replicate())));
  at::Tensor out = (*this)(in).to_local();
  grouping_.reset();
  return out;
}

at::Tensor GroupedExperts::run_through(TokenDispatcher& dispatcher, const at::Tensor& sorted,
                                       const std::vector<Placement>& token_layout,
                                       const std::function<void()>& behind_exchange) {
  const DeviceMesh& mesh = w1_->device_mesh();
  grouping_ = Grouping{{}, token_layout, &dispatcher, behind_exchange};
  DTensor in(sorted, mesh,
             make_spec(sorted.sizes().vec(), sorted.scalar_type(), mesh, std::vector<Placement>(mesh.ndim(), Replicate())));
  at::Tensor out = (*this)(in).to_local();
  grouping_.reset();
  return out;
}

DTensor GroupedExperts::forward(const DTensor& x) {
  HP_CHECK(grouping_) << "GroupedExperts computes tokens grouped by expert: call run(tokens, tokens_per_expert, "
                         "layout), as MoE does";
  ExpertFunction experts = function(grouping_->token_layout);
  at::Tensor out = grouping_->through
                       ? grouping_->through->run_experts(x.to_local(), experts, grouping_->behind_exchange)
                       : experts.run(x.to_local(), grouping_->tokens_per_expert, experts.weights);
  return DTensor(out, x.device_mesh(), make_spec(out.sizes().vec(), out.scalar_type(), x.device_mesh(), x.placements()));
}

ExpertFunction GroupedExperts::function(const std::vector<Placement>& token_layout) {
  const DeviceMesh& mesh = w1_->device_mesh();
  HP_CHECK(int64_t(token_layout.size()) == mesh.ndim())
      << "experts: token layout " << to_string_list(token_layout) << " is not on the experts' mesh " << mesh.to_string();
  std::vector<int> hidden_split;  // expert tensor parallel: partial outputs to sum
  for (int k = 0; k < mesh.ndim(); ++k) {
    const Placement& p = w1_->placements()[k];
    if (!p.is_shard()) continue;
    if (p.dim() == 0) {
      HP_CHECK(token_layout[k].is_shard())
          << "experts sharded over mesh dim '" << mesh.dim_names()[k]
          << "' need tokens split over it too (each rank its own batch), got " << to_string_list(token_layout);
    } else {
      HP_CHECK(token_layout[k].is_replicate())
          << "experts sharded on their hidden dim over mesh dim '" << mesh.dim_names()[k]
          << "' need the same tokens on every rank of it, got " << to_string_list(token_layout);
      hidden_split.push_back(k);
    }
  }
  ExpertFunction f;
  f.weights = {local_parameter(*w1_, token_layout), local_parameter(*w2_, token_layout),
               local_parameter(*w3_, token_layout)};
  f.run = [&mesh, hidden_split](const at::Tensor& tokens, const std::vector<int64_t>& tokens_per_expert,
                                const std::vector<at::Tensor>& w) {
    HP_CHECK(int64_t(tokens_per_expert.size()) == w[0].size(0))
        << "experts: " << tokens_per_expert.size() << " token counts for " << w[0].size(0) << " local experts";
    at::Tensor x = tokens;
    for (int k : hidden_split) x = comm::autograd::all_reduce_sum_backward(x, mesh.group(k));
    const at::Tensor gate = grouped_mm(x, w[0].transpose(1, 2), tokens_per_expert);
    const at::Tensor up = grouped_mm(x, w[2].transpose(1, 2), tokens_per_expert);
    at::Tensor out = grouped_mm(swiglu_local(gate, up), w[1].transpose(1, 2), tokens_per_expert);
    for (int k : hidden_split) out = comm::autograd::all_reduce_sum(out, mesh.group(k));
    return out;
  };
  return f;
}

MoE::MoE(int64_t dim, int64_t hidden_dim, const MoEOptions& options, const DeviceMesh& mesh)
    : o_(options),
      router_(register_module("router", std::make_shared<TokenChoiceTopKRouter>(dim, options, mesh))),
      experts_(register_module("experts",
                               std::make_shared<GroupedExperts>(dim, hidden_dim, options.num_experts, mesh))),
      dispatcher_(std::make_shared<TokenDispatcher>(TokenDispatcherOptions{options.capacity_factor, options.num_chunks})) {
  if (o_.num_shared_experts > 0) {
    LlamaConfig shared;
    shared.dim = dim;
    shared.ffn_dim = hidden_dim * o_.num_shared_experts;
    shared_experts_ = register_module("shared_experts", std::make_shared<MLP>(shared, mesh));
  }
}

DTensor MoE::forward(const DTensor& x) {
  const int64_t d = x.size(x.dim() - 1);
  DTensor flat = view(x, {-1, d});
  Routing r = router_->route(flat);
  at::Tensor per_choice;  // [T, top_k, D]
  std::optional<DTensor> shared;
  if (dispatcher_->pipelines()) {
    // The shared experts compute while the routed tokens' last exchange is in flight;
    // under a selective checkpoint after it, where its observer sees their ops.
    std::function<void()> run_shared;
    if (shared_experts_ && !observing()) run_shared = [&] { shared = (*shared_experts_)(flat); };
    at::Tensor sorted = dispatcher_->sort(flat.to_local(), r.indices, o_.num_experts);
    per_choice = dispatcher_->unsort(experts_->run_through(*dispatcher_, sorted, flat.placements(), run_shared));
  } else {
    DispatchedTokens in = dispatcher_->dispatch(flat.to_local(), r.indices, o_.num_experts);
    at::Tensor out = experts_->run(in.tokens, in.tokens_per_expert, flat.placements());
    per_choice = dispatcher_->combine(out);
  }
  at::Tensor routed = weighted_sum_of_choices(per_choice, r.weights.to(per_choice.scalar_type()));
  DTensor y(routed, flat.device_mesh(), flat.spec());
  if (shared_experts_) y = add(y, shared ? *shared : (*shared_experts_)(flat));
  y = view(y, x.sizes());
  if (!r.aux_sums) return y;
  const bool carry = aux_loss_carry_ > 0;
  const DTensor& sums = *r.aux_sums;
  // Carried, the loss is a value only: its gradient comes from the carrying node.
  auto loss = std::make_shared<AuxLoss>(carry ? sums.detach() : sums, r.aux_scale);
  if (carry)
    y = DTensor(carry_aux_loss(y.to_local(), sums.to_local(), loss, aux_loss_carry_), y.device_mesh(), y.spec());
  if (!recomputing()) aux_loss_ = std::move(loss);  // the forward's, whose value the loss reads
  return y;
}

std::vector<MoE*> moe_layers(Module& model) {
  std::vector<MoE*> out;
  for (auto& [name, m] : model.named_modules())
    if (auto* moe = dynamic_cast<MoE*>(m)) out.push_back(moe);
  return out;
}

double update_expert_bias(Module& model) {
  const std::vector<MoE*> layers = moe_layers(model);
  std::vector<TokenChoiceTopKRouter*> routers;
  for (MoE* moe : layers) routers.push_back(&moe->router());
  const std::vector<at::Tensor> loads = TokenChoiceTopKRouter::take_tokens_per_expert(routers);
  double worst = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const at::Tensor& load = loads[i];
    if (layers[i]->options().load_balance_bias) routers[i]->update_expert_bias(load);
    if (load.is_meta()) continue;  // a dry-run has shapes only
    const double mean = load.mean().item<double>();
    if (mean > 0) worst = std::max(worst, load.max().item<double>() / mean);
  }
  return worst;
}

std::optional<DTensor> moe_aux_loss(Module& model) {
  std::vector<AuxLoss*> losses;
  for (MoE* moe : moe_layers(model))
    if (moe->aux_loss_) losses.push_back(moe->aux_loss_.get());
  reduce_aux_losses(losses);
  std::optional<DTensor> total;
  for (AuxLoss* l : losses) total = total ? add(*total, l->value()) : l->value();
  return total;
}

}  // namespace hp::nn
