// A Llama-family decoder: rotary attention with grouped-query heads and a causal mask,
// a SwiGLU MLP, pre-norm blocks. Written once, with no parallelism in it.
#pragma once

#include <memory>

#include "hp/nn/layers.h"

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

  static LlamaConfig tiny() { return {}; }
  int64_t head_dim() const { return dim / heads; }
  void validate() const;  // throws naming the inconsistent fields
};

class Attention : public Module {
 public:
  Attention(const LlamaConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;  // [B, S, D] -> [B, S, D]

 private:
  LlamaConfig c_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

class MLP : public Module {
 public:
  MLP(const LlamaConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;  // down(silu(gate(x)) * up(x))

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(const LlamaConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;

 private:
  std::shared_ptr<RMSNorm> attn_norm_, mlp_norm_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<MLP> mlp_;
};

class Llama : public Module {
 public:
  Llama(const LlamaConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& ids) override;  // [B, S] ids -> [B, S, vocab] logits
  // Mean next-token cross-entropy of `targets` [B, S].
  DTensor loss(const DTensor& ids, const DTensor& targets);
  const LlamaConfig& config() const { return c_; }

 private:
  LlamaConfig c_;
  std::shared_ptr<Embedding> tok_embeddings_;
  std::vector<std::shared_ptr<TransformerBlock>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> output_;  // absent with tied embeddings
};

// Rotary position embedding of x [B, H, S, Dh] (rotate-half convention).
DTensor apply_rotary(const DTensor& x, double theta);
// Softmax over the last dim of scores [B, H, S, S] with future positions masked out.
DTensor causal_softmax(const DTensor& scores);
// [B, KV, S, Dh] -> [B, KV * rep, S, Dh], each kv head repeated for its query heads.
DTensor repeat_kv(const DTensor& x, int64_t rep);

}  // namespace hp::nn
