#include "hp/pipeline/stage.h"

#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <set>

#include "hp/base/error.h"

namespace hp::pipeline {

void PipelineStage::check() const {
  HP_CHECK(num_stages >= 1) << "pipeline stage " << stage_index << ": num_stages must be >= 1, got "
                            << num_stages;
  HP_CHECK(stage_index >= 0 && stage_index < num_stages)
      << "pipeline stage index " << stage_index << " out of range [0, " << num_stages << ")";
  HP_CHECK(forward) << "pipeline stage " << stage_index << " has no forward function";
  HP_CHECK(!is_last() || loss) << "pipeline stage " << stage_index << " is the last of " << num_stages
                               << " and needs a loss function";
  HP_CHECK(group) << "pipeline stage " << stage_index << " has no process group";
  for (size_t i = 0; i < parameters.size(); ++i)
    HP_CHECK(parameters[i].defined() && parameters[i].requires_grad())
        << "pipeline stage " << stage_index << ": parameter " << i
        << " must be a defined tensor with requires_grad";
}

void zero_grad(const PipelineStage& stage) {
  for (const auto& p : stage.parameters) p.mutable_grad() = at::Tensor();
}

namespace detail {
namespace {

// The tensor backward starts from and its incoming grad (none for the loss).
std::pair<at::Tensor, at::Tensor> root(const PipelineStage& st, const StageWork& w) {
  if (st.is_last()) return {w.loss, at::Tensor()};
  HP_CHECK(w.grad_output.defined()) << "stage " << st.stage_index << ": backward without an output grad";
  return {w.output, w.grad_output};
}

// The grad of the stage input as the previous stage expects it: whole, on every rank.
at::Tensor input_grad_of(const PipelineStage& st, const at::Tensor& g, const at::Tensor& input) {
  at::Tensor whole = g.defined() ? g : at::zeros_like(input);
  return st.gather_input_grad ? st.gather_input_grad(whole) : whole;
}

}  // namespace

StageWork run_forward(const PipelineStage& st, const at::Tensor& input, const at::Tensor& target,
                      double loss_scale, bool split) {
  StageWork w;
  w.input = input.detach();
  if (!st.is_first()) w.input.requires_grad_(true);
  std::optional<WeightOutputRecorder> recorder;
  if (split) recorder.emplace();
  w.output = st.forward(w.input);
  if (recorder) w.weight_outputs = recorder->take();
  HP_CHECK(w.output.defined()) << "stage " << st.stage_index << ": forward returned no tensor";
  if (st.is_last()) {
    HP_CHECK(target.defined()) << "stage " << st.stage_index << " (last): no target for the loss";
    at::Tensor l = st.loss(w.output, target);
    HP_CHECK(l.numel() == 1) << "stage " << st.stage_index << ": loss must be a scalar, got shape "
                             << l.sizes();
    w.loss = l.reshape({}) * loss_scale;
  }
  return w;
}

void run_backward(const PipelineStage& st, StageWork& w) {
  auto [out, grad] = root(st, w);
  torch::autograd::backward({out}, grad.defined() ? torch::autograd::variable_list{grad}
                                                  : torch::autograd::variable_list{});
  if (!st.is_first()) w.input_grad = input_grad_of(st, w.input.grad(), w.input);
}

void run_backward_input(const PipelineStage& st, StageWork& w) {
  torch::autograd::variable_list inputs;
  if (!st.is_first()) inputs.push_back(w.input);
  for (const WeightOutput& r : w.weight_outputs) inputs.push_back(r.output);
  if (inputs.empty()) return;
  auto [out, grad] = root(st, w);
  auto g = torch::autograd::grad({out}, inputs,
                                 grad.defined() ? torch::autograd::variable_list{grad}
                                                : torch::autograd::variable_list{},
                                 /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
  if (!st.is_first()) w.input_grad = input_grad_of(st, g[0], w.input);
  w.weight_output_grads.assign(g.begin() + (st.is_first() ? 0 : 1), g.end());
}

void run_backward_weight(const PipelineStage& st, StageWork& w, bool last) {
  // What the records cover; the rest comes from the stage output, as a full backward would.
  std::set<const void*> covered;
  std::vector<size_t> todo;  // records with a gradient, latest first (as backward meets them)
  for (size_t i = w.weight_outputs.size(); i-- > 0;) {
    if (i >= w.weight_output_grads.size() || !w.weight_output_grads[i].defined()) continue;
    todo.push_back(i);
    for (const at::Tensor& p : w.weight_outputs[i].params) covered.insert(p.unsafeGetTensorImpl());
  }
  torch::autograd::variable_list rest;
  for (const at::Tensor& p : st.parameters)
    if (!covered.count(p.unsafeGetTensorImpl())) rest.push_back(p);
  // The wrapper's sync goes on for the step's final backward only.
  auto sync = [&](bool final_call) {
    if (st.set_requires_gradient_sync) st.set_requires_gradient_sync(last && final_call);
  };
  for (size_t n = 0; n < todo.size(); ++n) {
    const WeightOutput& r = w.weight_outputs[todo[n]];
    sync(rest.empty() && n + 1 == todo.size());
    torch::autograd::backward({r.output}, {w.weight_output_grads[todo[n]]}, /*retain_graph=*/true,
                              /*create_graph=*/false, r.params);
  }
  if (!rest.empty()) {  // `inputs = {}` would mean every leaf
    auto [out, grad] = root(st, w);
    sync(true);
    torch::autograd::backward({out}, grad.defined() ? torch::autograd::variable_list{grad}
                                                    : torch::autograd::variable_list{},
                              /*retain_graph=*/false, /*create_graph=*/false, rest);
  }
  w.weight_outputs.clear();
  w.weight_output_grads.clear();
}

}  // namespace detail
}  // namespace hp::pipeline
