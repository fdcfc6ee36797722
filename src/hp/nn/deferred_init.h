// Deferred initialisation (the original HyperParallel's no_init_parameters() and
// init_parameters(model)): a model built inside no_init_parameters() holds parameters
// without storage (meta tensors of their whole shape), each with a record of how it would
// have been drawn and at which RNG state. Sharding slices them as it slices real ones
// (shard_module, parallelize_module, expert parallelism; fully_shard gives each rank's
// shard storage of the shard's size), and init_parameters(model) then draws every rank's
// piece at the recorded state: the numbers of a model built whole and then sharded, with
// no rank ever holding the whole model. hp::nn's layers (init_parameter, init_zeros)
// defer; a parameter a module makes some other way is made at once.
//
//   std::unique_ptr<nn::Llama> model;
//   {
//     auto scope = no_init_parameters();
//     model = std::make_unique<nn::Llama>(config, mesh);
//   }
//   parallelize_llama(*model, mesh["tp"]);
//   fully_shard_llama(*model, mesh["dp"]);
//   init_parameters(*model);  // before DDP, an optimizer, a checkpoint load or a forward
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "hp/tensor/dtensor.h"
#include "hp/tensor/random.h"

namespace hp::nn {

class Module;

// How a deferred parameter is to be drawn.
struct ParameterInit {
  double std = 0;     // > 0: N(0, std^2) drawn at `state`; 0: every element `value`
  double value = 0;
  RngState state;
  std::vector<int64_t> shape;  // the whole parameter's
};

// While alive, hp::nn's layers defer their parameters on this thread.
class NoInitParameters {
 public:
  NoInitParameters();
  ~NoInitParameters();
  NoInitParameters(const NoInitParameters&) = delete;
  NoInitParameters& operator=(const NoInitParameters&) = delete;
};
[[nodiscard]] inline NoInitParameters no_init_parameters() { return {}; }

bool initialization_deferred();  // inside a no_init_parameters() scope on this thread

// A deferred parameter: meta storage of `shape`, replicated on `mesh`, with `init` kept
// until Module::register_parameter takes it (take_pending_init).
DTensor deferred_parameter(const std::vector<int64_t>& shape, const DeviceMesh& mesh, ParameterInit init);
std::optional<ParameterInit> take_pending_init(const at::Tensor& local);

// Draws every deferred parameter of `module` and its descendants: one still without
// storage is replaced by this rank's piece; one a wrapper gave storage (fully_shard) is
// filled in place. The thread's RNG state is left where it was.
void init_parameters(Module& module);

}  // namespace hp::nn

namespace hp {
// The original HyperParallel's names, beside fully_shard and shard_module.
using nn::init_parameters;
using nn::no_init_parameters;
}  // namespace hp
