// The whole tensor-parallel recipe for the Llama model, in one place.
#pragma once

#include "hp/nn/transformer.h"
#include "hp/parallel/fully_shard.h"
#include "hp/parallel/tensor_parallel.h"

namespace hp {

struct LlamaParallelOptions {
  bool sequence_parallel = false;  // norms and residuals on sequence-sharded activations
  bool loss_parallel = true;       // logits stay vocabulary-sharded into the loss
};

void parallelize_llama(nn::Llama& model, const DeviceMesh& tp_mesh, const LlamaParallelOptions& options = {});

// fully_shard on every transformer block, then on the root (embedding, final norm, head).
FSDPModule fully_shard_llama(nn::Llama& model, const DeviceMesh& dp_mesh, const FullyShardOptions& options = {});

}  // namespace hp
