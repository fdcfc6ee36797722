// The whole tensor-parallel recipe for the Llama model, in one place.
#pragma once

#include "hp/nn/transformer.h"
#include "hp/parallel/tensor_parallel.h"

namespace hp {

struct LlamaParallelOptions {
  bool sequence_parallel = false;  // norms and residuals on sequence-sharded activations
  bool loss_parallel = true;       // logits stay vocabulary-sharded into the loss
};

void parallelize_llama(nn::Llama& model, const DeviceMesh& tp_mesh, const LlamaParallelOptions& options = {});

}  // namespace hp
