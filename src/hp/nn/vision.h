// A small vision encoder and the loss of a decoder that reads its image tokens before the
// text: the two halves of a vision-language model. No parallelism in here either.
#pragma once

#include <memory>
#include <vector>

#include "hp/nn/transformer.h"

namespace hp::nn {

struct VisionConfig {
  int64_t image = 8;     // square images, image x image pixels
  int64_t channels = 3;
  int64_t patch = 4;     // square patches; image must be a multiple
  LlamaConfig blocks;    // dim, heads, kv_heads, ffn_dim, layers of the encoder blocks (causal ignored)
  int64_t out_dim = 16;  // the decoder's dim: image tokens are projected to it

  int64_t num_patches() const { return (image / patch) * (image / patch); }
  int64_t patch_dim() const { return channels * patch * patch; }
  void validate() const;  // throws naming the inconsistent fields
};

// images [B, C, H, W] -> image tokens [B, P, out_dim]: patches through a Linear, then
// bidirectional transformer blocks, a norm and a projection to the decoder's width.
class VisionEncoder : public Module {
 public:
  VisionEncoder(const VisionConfig& c, const DeviceMesh& mesh);
  DTensor forward(const DTensor& images) override;
  const VisionConfig& config() const { return c_; }

 private:
  VisionConfig c_;
  std::shared_ptr<Linear> patch_embed_;
  std::vector<std::shared_ptr<TransformerBlock>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Linear> proj_;
};

// images [B, C, H, W] -> patches [B, P, C * patch * patch], row-major over the patch grid.
DTensor patchify(const DTensor& images, int64_t patch);

// Mean next-token cross-entropy of `tokens` [B, S + 1] read after `image_tokens` [B, P, dim]:
// the decoder sees [image tokens; embed(tokens[:, :S])] and predicts tokens[:, 1:] at the
// text positions.
DTensor image_text_loss(Llama& decoder, const DTensor& image_tokens, const DTensor& tokens);

}  // namespace hp::nn
