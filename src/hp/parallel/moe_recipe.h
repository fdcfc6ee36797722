// The parallel recipe of the MoE Llama, in one place: tensor parallelism (attention, dense
// MLPs and shared experts as the Llama's; routed experts by ExpertTensorParallel), expert
// parallelism, and fully_shard over the data-parallel ranks.
#pragma once

#include "hp/nn/moe_llama.h"
#include "hp/parallel/fully_shard.h"

namespace hp {

struct MoELlamaParallelOptions {
  bool loss_parallel = true;  // logits stay vocabulary-sharded into the loss
  // Activations between blocks Shard(1) over tp, norms per token; the MoE blocks route
  // their own sequence shard (MoESequenceParallel) instead of ExpertTensorParallel.
  bool sequence_parallel = false;
  // With sequence_parallel: attention's and the dense MLPs' collectives in pieces behind
  // their products, as parallelize_llama's async_tp (the MoE blocks route their own shard).
  bool async_tp = false;
};

void parallelize_moe_llama(nn::MoELlama& model, const DeviceMesh& tp_mesh, const MoELlamaParallelOptions& options = {});

// Experts of every MoE block sharded over `ep_mesh`, tokens exchanged by all-to-all.
void expert_parallelize_moe_llama(nn::MoELlama& model, const DeviceMesh& ep_mesh);

// fully_shard on each MoE block's routed experts over `expert_mesh` (their own unit:
// sharded over dp on top of ep), then on every block and the root over `mesh`. With
// experts over ep, torchtitan's layout (dp_shard_in_ep) is mesh = mesh[{"dp", "ep"}].
// flatten("dp_ep"), expert_mesh = mesh["dp"]: the other parameters sharded over every
// data-parallel rank, their gradients reduced over dp x ep in one reduce-scatter.
FSDPModule fully_shard_moe_llama(nn::MoELlama& model, const DeviceMesh& mesh, const DeviceMesh& expert_mesh,
                                 const FullyShardOptions& options = {});
// Everything over `dp_mesh` (parameters replicated over ep stay so).
FSDPModule fully_shard_moe_llama(nn::MoELlama& model, const DeviceMesh& dp_mesh, const FullyShardOptions& options = {});

}  // namespace hp
