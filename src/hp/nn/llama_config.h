// The shape of a Llama-family decoder. Plain data with no LibTorch include, so the
// trainer's config (torch-free) describes the model with this very struct.
#pragma once

#include <cstdint>

#include "hp/base/error.h"

namespace hp::nn {

struct LlamaConfig {
  int64_t vocab = 256;
  int64_t dim = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t ffn_dim = 384;
  int64_t max_seq = 128;
  double rope_theta = 10000;
  bool tied_embeddings = false;
  double norm_eps = 1e-6;
  bool causal = true;  // false: every position attends to all others (an encoder's blocks)

  static LlamaConfig tiny() { return {}; }
  int64_t head_dim() const { return dim / heads; }
  void validate() const;  // throws naming the inconsistent fields
};

inline void LlamaConfig::validate() const {
  HP_CHECK(vocab > 0 && dim > 0 && layers > 0 && heads > 0 && kv_heads > 0 && ffn_dim > 0)
      << "model sizes must be positive: vocab " << vocab << ", dim " << dim << ", layers " << layers << ", heads "
      << heads << ", kv_heads " << kv_heads << ", ffn_dim " << ffn_dim;
  HP_CHECK(dim % heads == 0) << "dim " << dim << " must be a multiple of heads " << heads;
  HP_CHECK(heads % kv_heads == 0) << "heads " << heads << " must be a multiple of kv_heads " << kv_heads;
  HP_CHECK(head_dim() % 2 == 0) << "head dim " << head_dim() << " must be even for rotary embeddings";
}

}  // namespace hp::nn
