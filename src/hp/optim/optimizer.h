// What every optimizer offers the trainer and the checkpoint layer: a step, the learning
// rate, and its state as tensors laid out like the parameter each belongs to.
#pragma once

#include <string>
#include <vector>

#include "hp/tensor/dtensor.h"

namespace hp::optim {

// One state tensor ("exp_avg", "momentum", ...) of one parameter. `local` has the local
// shape of `param` and the same ShardSpec, so a checkpoint can reshard it like the param.
struct StateEntry {
  const DTensor* param;
  std::string name;
  at::Tensor* local;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  virtual void zero_grad() = 0;
  virtual void set_lr(double lr) = 0;
  virtual double lr() const = 0;
  virtual std::vector<DTensor*> params() const = 0;
  // Steps taken so far (bias corrections depend on it); settable when loading.
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t steps) = 0;
  virtual std::vector<StateEntry> state() = 0;
};

// Drops the gradients of `params` (the next backward starts from none).
void zero_grads(const std::vector<DTensor*>& params);

// The local tensor of `params[index]` (and its gradient, where defined), checked to be in
// memory: fully_shard's offload policies release a shard and its gradient between uses,
// and an update on released storage would write nowhere. Throws naming the parameter.
at::Tensor resident_local(const std::vector<DTensor*>& params, size_t index, const char* optimizer);

}  // namespace hp::optim
