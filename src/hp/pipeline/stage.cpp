#include "hp/pipeline/stage.h"

#include <torch/csrc/autograd/autograd.h>

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
                      double loss_scale) {
  StageWork w;
  w.input = input.detach();
  if (!st.is_first()) w.input.requires_grad_(true);
  w.output = st.forward(w.input);
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
  if (st.is_first()) return;
  auto [out, grad] = root(st, w);
  auto g = torch::autograd::grad({out}, {w.input},
                                 grad.defined() ? torch::autograd::variable_list{grad}
                                                : torch::autograd::variable_list{},
                                 /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
  w.input_grad = input_grad_of(st, g[0], w.input);
}

void run_backward_weight(const PipelineStage& st, StageWork& w) {
  if (st.parameters.empty()) return;  // `inputs = {}` would mean every leaf
  auto [out, grad] = root(st, w);
  // Only the parameters: the input grad was taken by I.
  torch::autograd::backward({out}, grad.defined() ? torch::autograd::variable_list{grad}
                                                  : torch::autograd::variable_list{},
                            /*retain_graph=*/false, /*create_graph=*/false, st.parameters);
}

}  // namespace detail
}  // namespace hp::pipeline
