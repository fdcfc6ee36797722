#include "hp/optim/adamw.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/memory/offloaded_parameters.h"
#include "hp/tensor/ops.h"

namespace hp::optim {

AdamW::AdamW(std::vector<DTensor*> params, AdamWOptions options) : params_(std::move(params)), options_(options) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const DTensor* p = params_[i];
    HP_CHECK(!awaits_init(*p)) << not_drawn_yet("AdamW: parameter " + std::to_string(i), "before making the optimizer");
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
    at::Tensor p = resident_local(params_, i, "AdamW");
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

namespace {
bool in_memory(const at::Tensor& t) {
  return !t.defined() || t.numel() == 0 ||
         t.storage().nbytes() >= static_cast<size_t>(t.storage_offset() + t.numel()) * t.element_size();
}
}  // namespace

at::Tensor resident_local(const std::vector<DTensor*>& params, size_t index, const char* optimizer) {
  at::Tensor p = params[index]->to_local();
  HP_CHECK(in_memory(p) && in_memory(p.grad()))
      << optimizer << ": parameter " << index << " (local shape " << p.sizes()
      << ") or its gradient is not in memory: fully_shard's offload_policy keeps it in its tier between uses; "
      << "step with memory::SwapOptimizer over the module's offloaded_parameters(), or call "
      << "FSDPModule::bring_in_offloaded() first";
  return p;
}

void zero_grads(const std::vector<DTensor*>& params) {
  for (DTensor* p : params) {
    at::Tensor local = p->to_local();
    if (local.grad().defined()) local.mutable_grad().reset();
  }
}

namespace {

// Parameters whose gradients are sharded over the same dims of the same mesh: their
// squared norms add up locally and then over those dims' groups.
struct NormGroup {
  DeviceMesh mesh;
  std::vector<int> sharded_dims;
  at::Tensor sum_sq;  // float64 scalar on the mesh's device
};

std::vector<int> sharded_dims(const DTensor& p) {
  std::vector<int> dims;  // Partial parameters have Replicate gradients (gradient_spec)
  for (int d = 0; d < p.device_mesh().ndim(); ++d)
    if (p.placements()[d].is_shard()) dims.push_back(d);
  return dims;
}

}  // namespace

double clip_grad_norm_(const std::vector<DTensor*>& params, double max_norm, const comm::Group* other_stages,
                       memory::OffloadedParameters* offloaded) {
  // One parameter's gradient in memory at a time when they are in a tier.
  auto visit = [offloaded](DTensor* p, bool changing, const std::function<void()>& f) {
    if (offloaded) offloaded->bring_in_grads({p}, changing);
    f();
    if (offloaded) offloaded->send_out({p});
  };
  // Groups in first-appearance order, decided by layout alone, so every rank issues the
  // same collectives whichever of its parameters have gradients; a missing one adds zero.
  std::vector<NormGroup> groups;
  for (DTensor* p : params) {
    std::vector<int> dims = sharded_dims(*p);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const NormGroup& g) { return g.mesh == p->device_mesh() && g.sharded_dims == dims; });
    if (it == groups.end()) {
      groups.push_back({p->device_mesh(), dims, at::zeros({}, p->to_local().options().dtype(at::kDouble))});
      it = groups.end() - 1;
    }
    visit(p, /*changing=*/false, [&] {
      if (auto g = p->grad()) it->sum_sq += g->to_local().to(at::kDouble).square().sum();
    });
  }
  double total = 0;
  bool meta = false;  // a dry-run's meta tensors hold no value
  for (NormGroup& g : groups) {
    for (int d : g.sharded_dims) comm::all_reduce_(g.sum_sq, g.mesh.group(d));
    meta = meta || g.sum_sq.is_meta();
    if (!g.sum_sq.is_meta()) total += g.sum_sq.item<double>();
  }
  if (other_stages && other_stages->size() > 1) {
    at::Tensor sum = at::full({}, total, at::TensorOptions().dtype(at::kDouble).device(meta ? at::kMeta : at::kCPU));
    comm::all_reduce_(sum, *other_stages);
    if (!meta) total = sum.item<double>();
  }
  const double norm = std::sqrt(total);
  if (norm > max_norm) {
    at::NoGradGuard no_grad;
    for (DTensor* p : params)
      visit(p, /*changing=*/true, [&] {
        if (p->to_local().grad().defined()) p->to_local().mutable_grad().mul_(max_norm / (norm + 1e-6));
      });
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
