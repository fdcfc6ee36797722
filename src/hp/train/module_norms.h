// The per-module norms of the precision monitor: the L2 norm of each module's forward
// output and of the gradient flowing into that output, over the whole DTensor (every
// rank's piece), and the first module whose output or output gradient is not finite on
// some rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/comm/group.h"
#include "hp/nn/module.h"

namespace hp::train {

struct ModuleNorm {
  std::string module;
  double act_norm = 0, grad_norm = 0;
};

// With pipeline stages each rank runs the modules of its own chunks; the norms of every
// chunk come together on every rank, in the forward order of the whole model.
struct StageNorms {
  const comm::Group* other_stages = nullptr;  // the ranks at this rank's place in every stage
  std::map<std::string, int> chunk_of;        // this rank's top-level modules and their chunk
};

class ModuleNormRecorder {
 public:
  // Adds a forward hook, after the ones already there (so it sees the output as the next
  // module will), to each module of `model` that owns parameters itself: in a Llama the
  // embedding, the norms and the linear layers. `mesh`: the one the model lives on.
  ModuleNormRecorder(nn::Module& model, DeviceMesh mesh, StageNorms stages = {});

  // Whether the next forward and backward are recorded; unarmed, the hooks return at once.
  void arm(bool on);

  // After backward, on every rank in the same order (one small all-gather over the mesh,
  // and with stages two more over other_stages). Throws hp::Error naming `step`, the rank
  // and the module when some rank saw a non-finite output (first in forward order) or,
  // failing that, a non-finite output gradient (first to arrive in backward; with stages,
  // the last chunk's first). Otherwise each module's norms, the same on every rank, in
  // forward order. Disarms.
  std::vector<ModuleNorm> collect(int64_t step);

  struct State;  // shared with the hooks

 private:
  std::shared_ptr<State> state_;
  DeviceMesh mesh_;
  StageNorms stages_;
};

}  // namespace hp::train
