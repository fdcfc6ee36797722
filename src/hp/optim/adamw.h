// AdamW (decoupled weight decay) on DTensor parameters. Every update is elementwise, so
// each rank updates its own shards and the result equals the single-device update.
#pragma once

#include <vector>

#include "hp/optim/optimizer.h"

namespace hp::memory {
class OffloadedParameters;
}

namespace hp::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<DTensor*> params, AdamWOptions options = {});
  void step() override;
  void zero_grad() override { zero_grads(params_); }
  void set_lr(double lr) override { options_.lr = lr; }
  double lr() const override { return options_.lr; }
  std::vector<DTensor*> params() const override { return params_; }
  int64_t steps() const override { return step_; }
  void set_steps(int64_t steps) override { step_ = steps; }
  std::vector<StateEntry> state() override;  // "exp_avg", "exp_avg_sq" per parameter

 private:
  std::vector<DTensor*> params_;
  std::vector<at::Tensor> m_, v_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

// Scales gradients so that their global norm (every element of every parameter counted
// once, whatever the layout) is at most `max_norm`; returns the norm before clipping.
// Collective over the params' meshes: one float64 all-reduce per sharded mesh dim of each
// distinct layout, the same on every rank whichever parameters have gradients.
// `other_stages`: a group whose other ranks hold the rest of the model (pipeline stages,
// disjoint parameters); their squares join the norm with one more all-reduce over it.
// `offloaded`: gradients kept in a storage tier (fully_shard's offload policy) come in one
// parameter at a time, to read and then to scale, and go out again.
double clip_grad_norm_(const std::vector<DTensor*>& params, double max_norm,
                       const comm::Group* other_stages = nullptr, memory::OffloadedParameters* offloaded = nullptr);

// Linear warm-up to `base` over `warmup` steps, then cosine decay to base/10 at `total`.
double warmup_cosine_lr(int64_t step, double base, int64_t warmup, int64_t total);

}  // namespace hp::optim
