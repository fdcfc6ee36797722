#include "hp/nn/vision.h"

#include "hp/base/error.h"
#include "hp/tensor/ops.h"

namespace hp::nn {

void VisionConfig::validate() const {
  HP_CHECK(image > 0 && channels > 0 && patch > 0 && out_dim > 0)
      << "vision sizes must be positive: image " << image << ", channels " << channels << ", patch " << patch
      << ", out_dim " << out_dim;
  HP_CHECK(image % patch == 0) << "image size " << image << " must be a multiple of the patch size " << patch;
  blocks.validate();
}

DTensor patchify(const DTensor& images, int64_t patch) {
  HP_CHECK(images.dim() == 4) << "patchify: images must be [B, C, H, W], got " << images;
  const int64_t b = images.size(0), c = images.size(1), h = images.size(2) / patch, w = images.size(3) / patch;
  HP_CHECK(h * patch == images.size(2) && w * patch == images.size(3))
      << "patchify: image " << images.size(2) << "x" << images.size(3) << " is not a multiple of patch " << patch;
  DTensor grid = view(images, {b, c, h, patch, w, patch});
  return view(permute(grid, {0, 2, 4, 1, 3, 5}), {b, h * w, c * patch * patch});
}

VisionEncoder::VisionEncoder(const VisionConfig& c, const DeviceMesh& mesh) : c_(c) {
  c.validate();
  c_.blocks.causal = false;
  patch_embed_ = register_module("patch_embed", std::make_shared<Linear>(c.patch_dim(), c.blocks.dim, mesh));
  for (int64_t i = 0; i < c.blocks.layers; ++i)
    layers_.push_back(
        register_module("layers." + std::to_string(i), std::make_shared<TransformerBlock>(c_.blocks, mesh)));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(c.blocks.dim, mesh, c.blocks.norm_eps));
  proj_ = register_module("proj", std::make_shared<Linear>(c.blocks.dim, c.out_dim, mesh));
}

DTensor VisionEncoder::forward(const DTensor& images) {
  DTensor h = (*patch_embed_)(patchify(images, c_.patch));
  for (auto& layer : layers_) h = (*layer)(h);
  return (*proj_)((*norm_)(h));
}

DTensor image_text_loss(Llama& decoder, const DTensor& image_tokens, const DTensor& tokens) {
  HP_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2) << "image_text_loss: tokens must be [B, S + 1], got " << tokens;
  HP_CHECK(image_tokens.dim() == 3 && image_tokens.size(0) == tokens.size(0) &&
           image_tokens.size(2) == decoder.config().dim)
      << "image_text_loss: image tokens must be [B, P, " << decoder.config().dim << "] with B = " << tokens.size(0)
      << ", got " << image_tokens;
  const int64_t b = tokens.size(0), s = tokens.size(1) - 1, p = image_tokens.size(1);
  DTensor text = decoder.embed(narrow(tokens, 1, 0, s));
  DTensor logits = decoder.forward_embeddings(cat({image_tokens, text}, 1));
  // Position p + t predicts text token t + 1.
  DTensor text_logits = narrow(logits, 1, p, s);
  return cross_entropy(view(text_logits, {b * s, decoder.config().vocab}), view(narrow(tokens, 1, 1, s), {b * s}));
}

}  // namespace hp::nn
