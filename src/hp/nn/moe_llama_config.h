// The shape of a DeepSeek-V3-style MoE decoder: a Llama whose first `dense_layers` blocks
// keep the SwiGLU MLP and whose later blocks use a mixture of experts. Plain data with no
// LibTorch include, so the trainer's config describes the model with it.
#pragma once

#include "hp/nn/llama_config.h"
#include "hp/nn/moe_options.h"

namespace hp::nn {

struct MoELlamaConfig {
  LlamaConfig llama;        // layers counts dense and MoE blocks together
  MoEOptions moe;
  int64_t moe_hidden_dim = 64;  // each expert's SwiGLU width
  int64_t dense_layers = 1;

  void validate() const {
    llama.validate();
    moe.validate();
    HP_CHECK(moe_hidden_dim > 0) << "moe_hidden_dim must be positive, got " << moe_hidden_dim;
    HP_CHECK(dense_layers >= 0 && dense_layers <= llama.layers)
        << "dense_layers " << dense_layers << " must be in [0, layers " << llama.layers << "]";
  }
};

}  // namespace hp::nn
