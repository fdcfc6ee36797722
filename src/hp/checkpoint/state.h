// What a checkpoint holds: named tensors, each a piece of a global tensor laid out by a
// ShardSpec, plus named integer scalars (step, data position, RNG state...).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hp/layout/shard_spec.h"
#include "hp/tensor/dtensor.h"

namespace hp::nn {
class Module;
}
namespace hp::optim {
class Optimizer;
}

namespace hp::checkpoint {

struct TensorEntry {
  std::string name;
  at::Tensor local;             // this rank's piece; loading copies into it in place
  ShardSpec spec;               // the global tensor and how it is split
  std::vector<int64_t> coord;   // this rank's coordinate on spec.mesh()
};

class State {
 public:
  // A DTensor (skipped on ranks outside its mesh, such as another pipeline stage).
  void add(const std::string& name, const DTensor& t);
  // `local` laid out like `like` (an optimizer state tensor and its parameter).
  void add(const std::string& name, const at::Tensor& local, const DTensor& like);
  // Every parameter and buffer of `model` as prefix + its name.
  void add_module(nn::Module& model, const std::string& prefix = "model.");
  // Every state tensor of `opt` as prefix + parameter name + "." + state name; the names
  // of the parameters come from `named_params` (Module::named_parameters()).
  void add_optimizer(optim::Optimizer& opt, const std::vector<std::pair<std::string, DTensor*>>& named_params,
                     const std::string& prefix = "optim.");

  std::vector<TensorEntry> tensors;
  std::map<std::string, int64_t> scalars;  // saved as given; loading replaces them with the file's
};

}  // namespace hp::checkpoint
