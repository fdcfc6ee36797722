#include "hp/parallel/moe_recipe.h"

#include "hp/base/error.h"
#include "hp/parallel/expert_parallel.h"
#include "hp/parallel/llama_recipe.h"
#include "hp/parallel/tensor_parallel.h"

namespace hp {
namespace {

bool has_module(nn::Module& model, const std::string& pattern) {
  for (auto& [name, m] : model.named_modules())
    if (name_matches(pattern, name)) return true;
  return false;
}

// Rows of a plan that apply only when the model has such modules (all-dense or all-MoE
// models lack one kind of block).
ParallelPlan present(nn::Module& model, const ParallelPlan& plan) {
  ParallelPlan out;
  for (const auto& row : plan)
    if (has_module(model, row.first)) out.push_back(row);
  return out;
}

}  // namespace

void parallelize_moe_llama(nn::MoELlama& model, const DeviceMesh& tp_mesh, const MoELlamaParallelOptions& options) {
  const bool sp = options.sequence_parallel, a = options.async_tp;
  HP_CHECK(!a || sp) << "parallelize_moe_llama: async_tp decomposes the sequence-parallel collectives; set "
                     << "sequence_parallel too";
  const Placement between = sp ? Placement(Shard(1)) : Placement(Replicate());
  const Placement shared_out = sp ? Placement(Shard(0)) : Placement(Replicate());  // the MoE's token rows
  ParallelPlan plan = llama_block_plan(between, a);
  plan.insert(plan.end(), {
      {"layers.*.moe.shared_experts.gate_proj", ColwiseParallel()},
      {"layers.*.moe.shared_experts.up_proj", ColwiseParallel()},
      {"layers.*.moe.shared_experts.down_proj", RowwiseParallel(std::nullopt, shared_out)},
      {"layers.*.moe", sp ? MoESequenceParallel() : ExpertTensorParallel()},
      {"output", ColwiseParallel(Replicate(), options.loss_parallel ? Placement(Shard(-1)) : Placement(Replicate()))},
  });
  // As the Llama's (llama_recipe.cpp): the embedding hands out sequence shards, norms run
  // on them, and the blocks' parallel products gather their input first (with async_tp,
  // attention's and the dense MLPs' column-parallel products gather it themselves).
  if (sp && !a) plan.insert(plan.end(), {{"layers.*.attn", PrepareModuleInput(Replicate())},
                                          {"layers.*.mlp", PrepareModuleInput(Replicate())}});
  if (sp)
    plan.insert(plan.end(), {{"tok_embeddings", RowwiseParallel(Replicate(), between)},
                             {"layers.*.moe.shared_experts", PrepareModuleInput(Replicate())},
                             {"layers.*.attn_norm", SequenceParallel()},
                             {"layers.*.mlp_norm", SequenceParallel()},
                             {"norm", SequenceParallel()}});
  parallelize_module(model, tp_mesh, present(model, plan));
}

void expert_parallelize_moe_llama(nn::MoELlama& model, const DeviceMesh& ep_mesh) {
  parallelize_module(model, ep_mesh, present(model, {{"layers.*.moe", ExpertParallel()}}));
}

FSDPModule fully_shard_moe_llama(nn::MoELlama& model, const DeviceMesh& mesh, const DeviceMesh& expert_mesh,
                                 const FullyShardOptions& options) {
  for (auto& [name, m] : model.named_modules())
    if (name_matches("layers.*.moe.experts", name)) fully_shard(*m, expert_mesh, options);
  for (auto& [name, m] : model.named_modules())
    if (name_matches("layers.*", name)) fully_shard(*m, mesh, options);
  return fully_shard(model, mesh, options);
}

FSDPModule fully_shard_moe_llama(nn::MoELlama& model, const DeviceMesh& dp_mesh, const FullyShardOptions& options) {
  return fully_shard_moe_llama(model, dp_mesh, dp_mesh, options);
}

}  // namespace hp
