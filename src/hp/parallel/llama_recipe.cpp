#include "hp/parallel/llama_recipe.h"

#include <map>
#include <numeric>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp {

void parallelize_llama(nn::Llama& model, const DeviceMesh& tp_mesh, const LlamaParallelOptions& o) {
  HP_CHECK(!o.async_tp || o.sequence_parallel)
      << "parallelize_llama: async_tp decomposes the sequence-parallel collectives; set sequence_parallel too";
  // Between blocks activations are Replicate, or Shard(1) (sequence) with sequence parallel.
  const Placement between = o.sequence_parallel ? Shard(1) : Replicate();
  const bool a = o.async_tp;
  // async_tp: q, k, v (gate, up) gather their sequence-sharded input themselves, once.
  ParallelPlan plan;
  if (!a) plan.push_back({"layers.*.attn", PrepareModuleInput(Replicate())});
  plan.push_back({"tok_embeddings", RowwiseParallel(Replicate(), between)});
  const ParallelPlan block = llama_block_plan(between, a);
  plan.insert(plan.end(), block.begin(), block.end());
  if (!a) plan.push_back({"layers.*.mlp", PrepareModuleInput(Replicate())});
  if (o.sequence_parallel) {
    plan.push_back({"layers.*.attn_norm", SequenceParallel()});
    plan.push_back({"layers.*.mlp_norm", SequenceParallel()});
    plan.push_back({"norm", SequenceParallel()});
  }
  if (!model.config().tied_embeddings)
    plan.push_back({"output", ColwiseParallel(Replicate(), o.loss_parallel ? Shard(-1) : Replicate(), a)});
  parallelize_module(model, tp_mesh, plan);
}

ParallelPlan llama_block_plan(const Placement& between, bool async_tp) {
  const bool a = async_tp;
  return {
      {"layers.*.attn.q_proj", ColwiseParallel(Replicate(), Shard(-1), a)},
      {"layers.*.attn.k_proj", ColwiseParallel(Replicate(), Shard(-1), a)},
      {"layers.*.attn.v_proj", ColwiseParallel(Replicate(), Shard(-1), a)},
      {"layers.*.attn.o_proj", RowwiseParallel(std::nullopt, between, a)},
      {"layers.*.mlp.gate_proj", ColwiseParallel(Replicate(), Shard(-1), a)},
      {"layers.*.mlp.up_proj", ColwiseParallel(Replicate(), Shard(-1), a)},
      {"layers.*.mlp.down_proj", RowwiseParallel(std::nullopt, between, a)},
  };
}

FSDPModule fully_shard_llama(nn::Llama& model, const DeviceMesh& dp_mesh, const FullyShardOptions& options) {
  for (auto& [name, m] : model.named_modules())
    if (name.rfind("layers.", 0) == 0 && name.find('.', 7) == std::string::npos) fully_shard(*m, dp_mesh, options);
  return fully_shard(model, dp_mesh, options);
}

std::shared_ptr<nn::Sequential> llama_stage(nn::Module& model, const std::vector<int64_t>& layers_per_chunk,
                                            int index) {
  std::map<std::string, std::shared_ptr<nn::Module>> child;
  int64_t layers = 0;
  for (const auto& [name, m] : model.named_children()) {
    child[name] = m;
    if (name.rfind("layers.", 0) == 0) ++layers;
  }
  const int chunks = static_cast<int>(layers_per_chunk.size());
  HP_CHECK(std::accumulate(layers_per_chunk.begin(), layers_per_chunk.end(), int64_t{0}) == layers)
      << "llama_stage: the chunks " << to_string_list(layers_per_chunk) << " do not hold the model's " << layers
      << " layers";
  for (int64_t n : layers_per_chunk)
    HP_CHECK(n >= 0) << "llama_stage: negative layer count in " << to_string_list(layers_per_chunk);
  HP_CHECK(index >= 0 && index < chunks) << "llama_stage: chunk " << index << " of " << chunks;
  HP_CHECK(child.count("output")) << "llama_stage: tied embeddings cannot be split into pipeline stages (the "
                                  << "embedding and the head share one weight); set model.tied_embeddings = false";

  auto stage = std::make_shared<nn::Sequential>();
  auto take = [&](const std::string& name) {
    HP_CHECK(child.count(name)) << "llama_stage: the model has no module '" << name << "'";
    stage->append(name, child[name]);
  };
  const int64_t first = std::accumulate(layers_per_chunk.begin(), layers_per_chunk.begin() + index, int64_t{0});
  if (index == 0) take("tok_embeddings");
  for (int64_t i = first; i < first + layers_per_chunk[index]; ++i) take("layers." + std::to_string(i));
  if (index == chunks - 1) {
    take("norm");
    take("output");
  }
  return stage;
}

}  // namespace hp
