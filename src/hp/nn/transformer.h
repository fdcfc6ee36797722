// A Llama-family decoder: rotary attention with grouped-query heads and a causal mask,
// a SwiGLU MLP, pre-norm blocks. Written once, with no parallelism in it.
#pragma once

#include <functional>
#include <memory>

#include "hp/nn/layers.h"
#include "hp/nn/llama_config.h"

namespace hp::nn {

// Rotary position embedding of x [B, H, S, Dh] (rotate-half convention), positions taken
// globally (they may be sharded). The cos/sin tables are computed once (in float32, or
// float64 for float64 inputs) for positions [0, n) and grown when a longer sequence comes.
class Rotary {
 public:
  explicit Rotary(double theta) : theta_(theta) {}
  DTensor operator()(const DTensor& x);
  // A local x [B, H, S, Dh] whose S tokens sit at the global `positions` [S] (int64), in any
  // order: a sequence held in a load-balanced order (context parallelism).
  at::Tensor apply(const at::Tensor& x, const at::Tensor& positions);

 private:
  // cos and sin [end - first, Dh / 2] in `like`'s dtype and device.
  std::pair<at::Tensor, at::Tensor> tables(int64_t first, int64_t end, int64_t head_dim, const at::Tensor& like);
  double theta_;
  at::Tensor cos_, sin_;  // [n, Dh / 2]
};

// What the attention core receives: q [B, Hq, S, Dh] and k, v [B, Hkv, S, Dh], before
// rotary, and the rotary to apply.
struct AttentionCoreInputs {
  const DTensor& q;
  const DTensor& k;
  const DTensor& v;
  Rotary& rotary;
  bool causal;
};
// The attention core: rotary, then softmax attention, giving [B, Hq, S, Dh]. A parallel
// style may replace it from outside (context parallelism); the model holds none.
using AttentionCore = std::function<DTensor(const AttentionCoreInputs&)>;

class Attention : public Module {
 public:
  Attention(const LlamaConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;  // [B, S, D] -> [B, S, D]
  // Replaces the attention core; an empty one restores the built-in.
  void set_core(AttentionCore core) { core_ = std::move(core); }
  const LlamaConfig& config() const { return c_; }

 private:
  LlamaConfig c_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
  Rotary rotary_;
  AttentionCore core_;
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
  // The two halves of forward, for inputs that are not all tokens (image tokens
  // prepended to text). They bypass this module's own hooks (its blocks' still run).
  DTensor embed(const DTensor& ids);               // [B, S] -> [B, S, dim]
  DTensor forward_embeddings(const DTensor& h);    // [B, S, dim] -> [B, S, vocab] logits
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

// Rotary position embedding of x [B, H, S, Dh], tables made for this call only.
DTensor apply_rotary(const DTensor& x, double theta);

}  // namespace hp::nn
