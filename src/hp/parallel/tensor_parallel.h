// Tensor parallelism declared from outside the model: a style per module-name pattern,
// applied by parallelize_module. Each style changes the module's parameter layouts and
// registers hooks that lay out its input and output on the tensor-parallel mesh dim.
// Only that mesh dim changes; layouts on other dims (data parallel) are kept.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hp/nn/module.h"

namespace hp {

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // `dim`: the index of the tensor-parallel dim in the parameters' mesh.
  virtual void apply(nn::Module& module, const DeviceMesh& params_mesh, int dim) const = 0;
};
using Style = std::shared_ptr<const ParallelStyle>;

// Linear: weight rows sharded; input Replicate, output sharded on its last dim.
// Embedding: table columns sharded. `output` Replicate gathers the output.
// `async_tp` (Linear): an input arriving sequence-sharded (Shard(1), sequence parallel) is
// gathered piece by piece, each piece multiplied as it arrives (async_tp.h).
Style ColwiseParallel(Placement input = Replicate(), Placement output = Shard(-1), bool async_tp = false);
// Linear: weight columns sharded; input sharded on its last dim, partial output reduced to
// `output` (Replicate, or Shard(1) for sequence parallel: a reduce-scatter).
// Embedding: table rows (vocabulary) sharded; input Replicate.
// `async_tp` (Linear, output Shard(1)): the reduce-scatter's pieces are sent as their rows
// are multiplied (async_tp.h).
Style RowwiseParallel(std::optional<Placement> input = std::nullopt, Placement output = Replicate(),
                      bool async_tp = false);
// Norms and other per-token modules on sequence-sharded activations: input and output
// Shard(dim), parameters Replicate.
Style SequenceParallel(int seq_dim = 1);
// Redistribute the module's input (or output) to `layout` on the tensor-parallel dim.
Style PrepareModuleInput(Placement layout);
Style PrepareModuleOutput(Placement layout);

using ParallelPlan = std::vector<std::pair<std::string, Style>>;

// Applies each style to every module whose dotted name matches its pattern; "*" matches
// one name segment ("layers.*.attn.q_proj"). `tp_mesh` is a one-dim mesh (or sub-mesh)
// whose dim name appears in the parameters' mesh. A pattern that matches nothing is an
// error (a typo would otherwise leave the model silently unsharded).
void parallelize_module(nn::Module& module, const DeviceMesh& tp_mesh, const ParallelPlan& plan);

// shard_module: explicit placements. `plan` maps parameter-name patterns to placements on
// the whole mesh; `input_plan` / `output_plan` lay out the root module's input and output.
struct ShardingPlan {
  std::vector<std::pair<std::string, std::vector<Placement>>> plan;
  std::optional<std::vector<Placement>> input_plan;
  std::optional<std::vector<Placement>> output_plan;
};
void shard_module(nn::Module& module, const DeviceMesh& mesh, const ShardingPlan& plan);

// Does dotted `name` match `pattern` segment by segment, "*" matching any one segment?
bool name_matches(const std::string& pattern, const std::string& name);

// `placements` with entry `dim` set to `p`.
std::vector<Placement> with_placement(std::vector<Placement> placements, int dim, Placement p);

}  // namespace hp
