// The per-module norms of the precision monitor: the L2 norm of each module's forward
// output and of the gradient flowing into that output, over the whole DTensor (every
// rank's piece), and the first module whose output or output gradient is not finite on
// some rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hp/nn/module.h"

namespace hp::train {

struct ModuleNorm {
  std::string module;
  double act_norm = 0, grad_norm = 0;
};

class ModuleNormRecorder {
 public:
  // Adds a forward hook, after the ones already there (so it sees the output as the next
  // module will), to each module of `model` that owns parameters itself: in a Llama the
  // embedding, the norms and the linear layers. `mesh`: the one the model lives on.
  ModuleNormRecorder(nn::Module& model, DeviceMesh mesh);

  // Whether the next forward and backward are recorded; unarmed, the hooks return at once.
  void arm(bool on);

  // After backward, on every rank in the same order (one small all-gather over the mesh).
  // Throws hp::Error naming `step`, the rank and the module when some rank saw a
  // non-finite output (first in forward order) or, failing that, a non-finite output
  // gradient (first to arrive in backward). Otherwise each module's norms, the same on
  // every rank, in forward order. Disarms.
  std::vector<ModuleNorm> collect(int64_t step);

  struct State;  // shared with the hooks

 private:
  std::shared_ptr<State> state_;
  DeviceMesh mesh_;
};

}  // namespace hp::train
