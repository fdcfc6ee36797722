#include "hp/parallel/llama_recipe.h"

namespace hp {

void parallelize_llama(nn::Llama& model, const DeviceMesh& tp_mesh, const LlamaParallelOptions& o) {
  // Between blocks activations are Replicate, or Shard(1) (sequence) with sequence parallel.
  const Placement between = o.sequence_parallel ? Shard(1) : Replicate();
  ParallelPlan plan = {
      {"tok_embeddings", RowwiseParallel(Replicate(), between)},
      {"layers.*.attn", PrepareModuleInput(Replicate())},
      {"layers.*.attn.q_proj", ColwiseParallel()},
      {"layers.*.attn.k_proj", ColwiseParallel()},
      {"layers.*.attn.v_proj", ColwiseParallel()},
      {"layers.*.attn.o_proj", RowwiseParallel(std::nullopt, between)},
      {"layers.*.mlp", PrepareModuleInput(Replicate())},
      {"layers.*.mlp.gate_proj", ColwiseParallel()},
      {"layers.*.mlp.up_proj", ColwiseParallel()},
      {"layers.*.mlp.down_proj", RowwiseParallel(std::nullopt, between)},
  };
  if (o.sequence_parallel) {
    plan.push_back({"layers.*.attn_norm", SequenceParallel()});
    plan.push_back({"layers.*.mlp_norm", SequenceParallel()});
    plan.push_back({"norm", SequenceParallel()});
  }
  if (!model.config().tied_embeddings)
    plan.push_back({"output", ColwiseParallel(Replicate(), o.loss_parallel ? Shard(-1) : Replicate())});
  parallelize_module(model, tp_mesh, plan);
}

FSDPModule fully_shard_llama(nn::Llama& model, const DeviceMesh& dp_mesh, const FullyShardOptions& options) {
  for (auto& [name, m] : model.named_modules())
    if (name.rfind("layers.", 0) == 0 && name.find('.', 7) == std::string::npos) fully_shard(*m, dp_mesh, options);
  return fully_shard(model, dp_mesh, options);
}

}  // namespace hp
