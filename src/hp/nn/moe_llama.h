// A Llama whose later blocks route tokens to experts (DeepSeek-V3's layout): blocks
// 0..dense_layers-1 hold the SwiGLU MLP ("layers.N.mlp"), the others a MoE
// ("layers.N.moe"). Written once, with no parallelism in it.
#pragma once

#include <memory>
#include <vector>

#include "hp/nn/moe.h"
#include "hp/nn/moe_llama_config.h"

namespace hp::nn {

class MoEBlock : public Module {
 public:
  MoEBlock(const MoELlamaConfig& c, bool dense, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;

 private:
  std::shared_ptr<RMSNorm> attn_norm_, mlp_norm_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Module> ffn_;  // MLP or MoE
};

class MoELlama : public Module {
 public:
  MoELlama(const MoELlamaConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& ids) override;  // [B, S] ids -> [B, S, vocab] logits
  // Mean next-token cross-entropy of `targets` [B, S], plus the MoE layers' auxiliary
  // losses when aux_loss_coef > 0.
  DTensor loss(const DTensor& ids, const DTensor& targets);
  const MoELlamaConfig& config() const { return c_; }

 private:
  MoELlamaConfig c_;
  std::shared_ptr<Embedding> tok_embeddings_;
  std::vector<std::shared_ptr<MoEBlock>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> output_;  // absent with tied embeddings
};

}  // namespace hp::nn
