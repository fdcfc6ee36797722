#include "hp/memory/region_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/memory/nested_regions.h"
#include "hp/tensor/ops.h"

namespace hp::memory {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// at::linear without bias folds x to rows and runs mm(x2d, weight.t()); autograd's mm
// backward then computes these two products, on operands laid out the same.
struct LinearGraphOnly : torch::autograd::Function<LinearGraphOnly> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return at::zeros(sizes, x.options());  // not read; zeros keep garbage out of what it flows through
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor g = grads[0].reshape({-1, weight.size(0)});
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = g.mm(weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) dw = g.t().mm(x.reshape({-1, x.size(-1)}));
    return {dx, dw};
  }
};

bool is_at_linear(const ObservedOp& op) {
  return op.op && op.op->kind == OpKind::Linear && op.op->label == kAtLinearLabel && op.inputs &&
         op.inputs->size() == 2 && (*op.inputs)[0].dim() >= 2 && (*op.inputs)[1].dim() == 2;
}

}  // namespace

WeightUses::WeightUses(const std::vector<at::Tensor>& params) : uses_(params.size(), 0) {
  for (size_t i = 0; i < params.size(); ++i) params_.insert(params[i], static_cast<int>(i));
}

WeightUse WeightUses::of(const ObservedOp& op) {
  if (!is_at_linear(op)) return {-1, -1};
  const int* p = params_.find((*op.inputs)[1]);
  if (!p) return {-1, -1};
  return {*p, uses_[*p]++};
}

at::Tensor linear_graph_only(const at::Tensor& x, const at::Tensor& weight) {
  HP_CHECK(x.is_contiguous() && x.dim() >= 2 && weight.dim() == 2)
      << "linear_graph_only: a contiguous input of 2 or more dimensions and a 2-D weight, got " << x.sizes() << " "
      << (x.is_contiguous() ? "contiguous" : "not contiguous") << " and " << weight.sizes();
  return LinearGraphOnly::apply(x, weight);
}

ForwardOps::ForwardOps(const std::vector<at::Tensor>& params)
    : weights_(params), nest_(Nest::current()), outer_(op_observer()) {
  scope_ = std::make_unique<ScopedOpObserver>(this);
}

ForwardOps::~ForwardOps() = default;

at::Tensor ForwardOps::run(const ObservedOp& op, const std::function<at::Tensor()>& compute) {
  at::Tensor out = outer_ ? outer_->run(op, compute) : compute();
  if (Nest::current() != nest_) return out;  // a nested region's op
  Seen seen;
  seen.weight = weights_.of(op);
  seen.keeps_no_values = !op.op || op.op->kind == OpKind::Add || op.op->kind == OpKind::View;
  seen.output = storage_of(out);
  const int k = static_cast<int>(ops_.size());
  if (op.inputs)
    for (const at::Tensor& t : *op.inputs)
      if (const int* producer = by_storage_.find(t); producer && *producer != k) ops_[*producer].readers.push_back(k);
  by_storage_.insert(out, k);
  ops_.push_back(std::move(seen));
  return out;
}

std::vector<WeightUse> ForwardOps::graph_only(const at::Tensor& output) const {
  // Walking back from the last op: an output's value is needed where an op that keeps
  // values reads it, or one that keeps none whose own output is needed; it reaches the
  // region's output where it is that output, or an op that keeps none carries it there.
  std::vector<bool> needed(ops_.size(), false), reaches(ops_.size(), false);
  const void* out = storage_of(output);
  std::vector<WeightUse> found;
  for (size_t k = ops_.size(); k-- > 0;) {
    const Seen& s = ops_[k];
    reaches[k] = s.output != nullptr && s.output == out;
    for (int r : s.readers) {
      const bool passes = ops_[r].keeps_no_values;
      needed[k] = needed[k] || !passes || needed[r];
      reaches[k] = reaches[k] || (passes && reaches[r]);
    }
    if (s.weight.first >= 0 && reaches[k] && !needed[k]) found.push_back(s.weight);
  }
  return found;
}

GraphOnlyRecompute::GraphOnlyRecompute(const std::vector<WeightUse>& graph_only, const std::vector<at::Tensor>& params)
    : graph_only_(graph_only),
      weights_(params),
      nest_(Nest::current()),
      outer_(op_observer()) {
  scope_ = std::make_unique<ScopedOpObserver>(this);
}

GraphOnlyRecompute::~GraphOnlyRecompute() = default;

at::Tensor GraphOnlyRecompute::run(const ObservedOp& op, const std::function<at::Tensor()>& compute) {
  // Another observer (a selective region's) must see the op run; a nested region's ops are its own.
  if (outer_ || Nest::current() != nest_) return outer_ ? outer_->run(op, compute) : compute();
  const WeightUse use = weights_.of(op);
  if (use.first < 0 || std::find(graph_only_.begin(), graph_only_.end(), use) == graph_only_.end() ||
      !(*op.inputs)[0].is_contiguous())
    return compute();
  at::Tensor out = linear_graph_only((*op.inputs)[0], (*op.inputs)[1]);
  if (out.grad_fn()) nodes_.push_back(out.grad_fn().get());
  return out;
}

bool GraphOnlyRecompute::read(const at::Tensor& out, uint64_t first_seq) const {
  const std::vector<bool> read = values_read(out, first_seq, nodes_);
  return std::find(read.begin(), read.end(), true) != read.end();
}

}  // namespace hp::memory
