#include "hp/optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "hp/tensor/ops.h"

namespace hp::optim {

AdamW::AdamW(std::vector<DTensor*> params, AdamWOptions options) : params_(std::move(params)), options_(options) {
  for (DTensor* p : params_) {
    m_.push_back(at::zeros_like(p->to_local()));
    v_.push_back(at::zeros_like(p->to_local()));
  }
}

void AdamW::step() {
  at::NoGradGuard no_grad;
  ++step_;
  const auto& o = options_;
  const double bias1 = 1 - std::pow(o.beta1, double(step_)), bias2 = 1 - std::pow(o.beta2, double(step_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i]->to_local();
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    p.mul_(1 - o.lr * o.weight_decay);
    m_[i].mul_(o.beta1).add_(g, 1 - o.beta1);
    v_[i].mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    at::Tensor denom = (v_[i] / bias2).sqrt_().add_(o.eps);
    p.addcdiv_(m_[i], denom, -o.lr / bias1);
  }
}

std::vector<StateEntry> AdamW::state() {
  std::vector<StateEntry> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i], "exp_avg", &m_[i]});
    out.push_back({params_[i], "exp_avg_sq", &v_[i]});
  }
  return out;
}

void zero_grads(const std::vector<DTensor*>& params) {
  for (DTensor* p : params) {
    at::Tensor local = p->to_local();
    if (local.grad().defined()) local.mutable_grad().reset();
  }
}

double clip_grad_norm_(const std::vector<DTensor*>& params, double max_norm) {
  double total = 0;
  for (DTensor* p : params) {
    auto g = p->grad();
    if (!g) continue;
    std::vector<int64_t> dims(g->dim());
    for (int64_t d = 0; d < g->dim(); ++d) dims[d] = d;
    DTensor sq = g->dim() == 0 ? mul(*g, *g) : sum(mul(*g, *g), dims);
    at::Tensor whole = sq.full_tensor();
    if (!whole.is_meta()) total += whole.item<double>();  // a dry-run's meta tensors hold no value
  }
  const double norm = std::sqrt(total);
  if (norm > max_norm) {
    at::NoGradGuard no_grad;
    for (DTensor* p : params)
      if (p->to_local().grad().defined()) p->to_local().mutable_grad().mul_(max_norm / (norm + 1e-6));
  }
  return norm;
}

double warmup_cosine_lr(int64_t step, double base, int64_t warmup, int64_t total) {
  if (warmup > 0 && step < warmup) return base * double(step + 1) / double(warmup);
  if (total <= warmup) return base;
  const double t = std::min(1.0, double(step - warmup) / double(total - warmup));
  return base * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * t)));
}

}  // namespace hp::optim
