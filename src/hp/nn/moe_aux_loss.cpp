#include "hp/nn/moe_aux_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <string>

#include "hp/base/runs.h"
#include "hp/tensor/ops.h"

namespace hp::nn {
namespace {

bool laid_out_alike(const DTensor& a, const DTensor& b) {
  return a.device_mesh() == b.device_mesh() && a.placements() == b.placements() &&
         a.scalar_type() == b.scalar_type();
}

struct CarryAuxLossBackward : torch::autograd::Node {
  std::shared_ptr<AuxLoss> loss;
  double scale = 0;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    // d(scale * loss) / d scores_e = scale * loss's scale * assignments_e, rounded as the
    // loss's own backward would round it; the assignments are counts, with no gradient.
    const at::Tensor& load = loss->load();
    const at::Tensor grad_loss = at::full({}, scale, load.options()) * loss->scale();
    at::Tensor grad_sums = at::cat({at::zeros_like(load), load * grad_loss});
    return {grads[0], grad_sums};
  }
  std::string name() const override { return "CarryAuxLossBackward"; }
  void release_variables() override { loss.reset(); }
};

}  // namespace

const DTensor& AuxLoss::value() {
  if (!value_) reduce_aux_losses({this});
  return *value_;
}

const at::Tensor& AuxLoss::load() {
  value();
  return load_;
}

void reduce_aux_losses(const std::vector<AuxLoss*>& losses) {
  std::vector<AuxLoss*> pending;
  for (AuxLoss* l : losses)
    if (!l->value_) pending.push_back(l);
  auto alike = [&](size_t i, size_t j) { return laid_out_alike(pending[i]->sums_, pending[j]->sums_); };
  for_each_run(pending.size(), alike, [&](size_t first, size_t end) {  // one all-reduce per run
    std::vector<DTensor> parts;
    for (size_t i = first; i < end; ++i) parts.push_back(pending[i]->sums_);
    const DTensor& any = pending[first]->sums_;
    DTensor reduced = (parts.size() == 1 ? parts[0] : cat(parts, 0))
                          .redistribute(std::vector<Placement>(any.device_mesh().ndim(), Replicate()));
    int64_t offset = 0;
    for (size_t i = first; i < end; ++i) {
      AuxLoss& l = *pending[i];
      const int64_t e = l.sums_.size(0) / 2;
      DTensor load = narrow(reduced, 0, offset, e), mass = narrow(reduced, 0, offset + e, e);
      offset += 2 * e;
      l.value_ = map(sum(mul(load, mass), {0}), [s = l.scale_](const at::Tensor& v) { return v * s; });
      l.load_ = load.to_local().detach();
    }
  });
}

at::Tensor carry_aux_loss(const at::Tensor& x, const at::Tensor& sums, std::shared_ptr<AuxLoss> loss, double scale) {
  if (!at::GradMode::is_enabled() || (!x.requires_grad() && !sums.requires_grad())) return x;
  auto node = std::shared_ptr<CarryAuxLossBackward>(new CarryAuxLossBackward(), torch::autograd::deleteNode);
  node->loss = std::move(loss);
  node->scale = scale;
  node->set_next_edges(torch::autograd::collect_next_edges(x, sums));
  at::Tensor y = x.detach();  // an alias: the identity needs no bytes of its own
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace hp::nn
