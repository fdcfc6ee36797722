// The whole tensor-parallel recipe for the Llama model, in one place.
#pragma once

#include <memory>
#include <vector>

#include "hp/nn/sequential.h"
#include "hp/nn/transformer.h"
#include "hp/parallel/fully_shard.h"
#include "hp/parallel/tensor_parallel.h"

namespace hp {

struct LlamaParallelOptions {
  bool sequence_parallel = false;  // norms and residuals on sequence-sharded activations
  bool loss_parallel = true;       // logits stay vocabulary-sharded into the loss
  // With sequence_parallel: the all-gather before each column-parallel Linear and the
  // reduce-scatter after each row-parallel one split into per-rank pieces that travel
  // while other pieces multiply (PyTorch's async TP; async_tp.h). Bitwise the same result.
  bool async_tp = false;
};

void parallelize_llama(nn::Llama& model, const DeviceMesh& tp_mesh, const LlamaParallelOptions& options = {});

// The rows of a block's attention and SwiGLU MLP (Megatron's split: q, k, v, gate, up
// column-parallel, o and down row-parallel, their output `between` blocks), shared by the
// Llama's and the MoE Llama's recipes.
ParallelPlan llama_block_plan(const Placement& between, bool async_tp);

// fully_shard on every transformer block, then on the root (embedding, final norm, head).
FSDPModule fully_shard_llama(nn::Llama& model, const DeviceMesh& dp_mesh, const FullyShardOptions& options = {});

// Chunk `index` of `model` cut into consecutive chunks of `layers_per_chunk` blocks, as a
// pipeline stage: its blocks, with the embedding in chunk 0 and the final norm and head in
// the last chunk. `model` is a Llama, or any model whose children are named as its are
// (tok_embeddings, layers.N, norm, output: the MoE Llama). The modules are `model`'s own
// (parallelise the whole model first), and their parameters keep the model's names, so
// optimizers and checkpoints see one model whatever the split. Tied embeddings (no
// "output") are refused: the embedding's weight would be the head's too.
std::shared_ptr<nn::Sequential> llama_stage(nn::Module& model, const std::vector<int64_t>& layers_per_chunk,
                                            int index);

}  // namespace hp
