#include "hp/comm/autograd.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "hp/comm/collectives.h"

namespace hp::comm::autograd {
namespace {

// A graph node that runs a C++ closure; the group it captures outlives the step.
struct ClosureBackward : torch::autograd::Node {
  std::function<at::Tensor(const at::Tensor&)> fn;
  std::string label;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {fn(grads[0])};
  }
  std::string name() const override { return label; }
};

}  // namespace

at::Tensor attach_backward(at::Tensor out, const at::Tensor& input,
                           std::function<at::Tensor(const at::Tensor&)> backward, const char* name) {
  if (!input.requires_grad() || !at::GradMode::is_enabled()) return out;
  auto node = std::shared_ptr<ClosureBackward>(new ClosureBackward(), torch::autograd::deleteNode);
  node->fn = std::move(backward);
  node->label = name;
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
  return out;
}

at::Tensor all_gather(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes) {
  at::Tensor out = comm::all_gather(t.detach(), g, dim, sizes);
  if (sizes.empty()) sizes.assign(g.size(), t.size(dim));
  return attach_backward(out, t, [&g, dim, sizes](const at::Tensor& grad) {
    return comm::reduce_scatter(grad, g, dim, ReduceOp::Sum, sizes);
  }, "AllGatherBackward");
}

at::Tensor reduce_scatter(const at::Tensor& t, const Group& g, int64_t dim, std::vector<int64_t> sizes) {
  if (sizes.empty()) sizes = chunk_sizes(t.size(dim), g.size());
  at::Tensor out = comm::reduce_scatter(t.detach(), g, dim, ReduceOp::Sum, sizes);
  return attach_backward(out, t, [&g, dim, sizes](const at::Tensor& grad) {
    return comm::all_gather(grad, g, dim, sizes);
  }, "ReduceScatterBackward");
}

at::Tensor all_to_all(const at::Tensor& t, const Group& g, int64_t split_dim, int64_t concat_dim,
                      std::vector<int64_t> split_sizes, std::vector<int64_t> concat_sizes) {
  const int64_t nd = t.dim();
  split_dim = split_dim < 0 ? split_dim + nd : split_dim;
  concat_dim = concat_dim < 0 ? concat_dim + nd : concat_dim;
  if (split_sizes.empty()) split_sizes = chunk_sizes(t.size(split_dim), g.size());
  if (concat_sizes.empty())
    concat_sizes.assign(g.size(), split_dim == concat_dim ? split_sizes[g.rank()] : t.size(concat_dim));
  at::Tensor out = comm::all_to_all(t.detach(), g, split_dim, concat_dim, split_sizes, concat_sizes);
  // The inverse: split what we concatenated, concatenate what we split.
  return attach_backward(out, t, [&g, split_dim, concat_dim, split_sizes, concat_sizes](const at::Tensor& grad) {
    return comm::all_to_all(grad, g, concat_dim, split_dim, concat_sizes, split_sizes);
  }, "AllToAllBackward");
}

at::Tensor all_reduce_sum(const at::Tensor& t, const Group& g) {
  at::Tensor out = comm::all_reduce(t.detach(), g, ReduceOp::Sum);
  return attach_backward(out, t, [](const at::Tensor& grad) { return grad; }, "AllReduceSumBackward");
}

at::Tensor all_reduce_sum_backward(const at::Tensor& t, const Group& g) {
  // Over one rank, nothing: a node would copy each gradient, and hold it until the engine
  // reached the node, whose place in the backward is that of the forward's first use.
  if (g.size() == 1) return t;
  // An alias, not a copy: the identity needs no bytes of its own, and a copy would be kept
  // for backward by every op that saves its input (each column-parallel projection).
  at::Tensor out = t.detach();
  return attach_backward(out, t, [&g](const at::Tensor& grad) {
    return comm::all_reduce(grad, g, ReduceOp::Sum);
  }, "IdentityAllReduceBackward");
}

}  // namespace hp::comm::autograd
