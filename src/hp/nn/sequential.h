// Modules applied one after another. Each child keeps the name it is registered under,
// so a Sequential made of another model's children (a pipeline stage of it) names its
// parameters as the whole model does: "layers.3.attn.q_proj.weight".
#pragma once

#include <memory>
#include <string>

#include "hp/nn/module.h"

namespace hp::nn {

class Sequential : public Module {
 public:
  // Registers `module` under `name` (dots allowed) as the next one to run.
  void append(std::string name, std::shared_ptr<Module> module);
  DTensor forward(const DTensor& x) override;  // the identity when empty
  size_t size() const { return named_children().size(); }
};

}  // namespace hp::nn
