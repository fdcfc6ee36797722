// A MoE layer's load-balancing loss, coef * E * sum_e f_e P_e over the whole batch (f_e the
// share of assignments to expert e, P_e its mean score), reduced late. Each rank holds
// its share of the two sums per expert; they are reduced when the loss is first read, and
// reduce_aux_losses reduces every layer's in one all-reduce: no collective waits on a
// layer's critical path, and a step issues one for all its layers instead of one each.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

#include "hp/tensor/dtensor.h"

namespace hp::nn {

class AuxLoss {
 public:
  // sums [2E]: assignments, then scores per expert, this rank's share (partial over the
  // mesh dims its tokens are split over); loss = scale * sum_e assignments_e * scores_e
  // once reduced. Whatever graph `sums` has, the loss has.
  AuxLoss(DTensor sums, double scale) : sums_(std::move(sums)), scale_(scale) {}
  // The loss, a replicated scalar. Reduces the sums first if reduce_aux_losses has not:
  // a collective, which every rank of the split dims must call alike.
  const DTensor& value();
  // The assignments per expert over the whole batch, detached (value() first if needed).
  const at::Tensor& load();
  double scale() const { return scale_; }

 private:
  friend void reduce_aux_losses(const std::vector<AuxLoss*>& losses);
  DTensor sums_;
  double scale_;
  std::optional<DTensor> value_;
  at::Tensor load_;
};

// Reduces the sums of the losses not yet reduced: one all-reduce for each run of losses
// whose sums are laid out alike (every layer of a model, usually).
void reduce_aux_losses(const std::vector<AuxLoss*>& losses);

// `x` itself, whose backward also gives `sums` (the local [2E] tensor `loss` was made of,
// with its graph) the gradient it would get had scale * loss been added to the loss: how
// a pipeline stage's auxiliary losses reach the backward when the loss lives on another
// stage (Megatron's MoEAuxLossAutoScaler). The backward reads the reduced assignments, so
// it reduces them if nothing read the loss before.
at::Tensor carry_aux_loss(const at::Tensor& x, const at::Tensor& sums, std::shared_ptr<AuxLoss> loss, double scale);

}  // namespace hp::nn
