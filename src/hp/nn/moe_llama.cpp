#include "hp/nn/moe_llama.h"

#include "hp/tensor/ops.h"

namespace hp::nn {

MoEBlock::MoEBlock(const MoELlamaConfig& c, bool dense, const DeviceMesh& mesh)
    : attn_norm_(register_module("attn_norm", std::make_shared<RMSNorm>(c.llama.dim, mesh, c.llama.norm_eps))),
      mlp_norm_(register_module("mlp_norm", std::make_shared<RMSNorm>(c.llama.dim, mesh, c.llama.norm_eps))),
      attn_(register_module("attn", std::make_shared<Attention>(c.llama, mesh))) {
  if (dense)
    ffn_ = register_module("mlp", std::make_shared<MLP>(c.llama, mesh));
  else
    ffn_ = register_module("moe", std::make_shared<MoE>(c.llama.dim, c.moe_hidden_dim, c.moe, mesh));
}

DTensor MoEBlock::forward(const DTensor& x) {
  DTensor h = add(x, (*attn_)((*attn_norm_)(x)));
  return add(h, (*ffn_)((*mlp_norm_)(h)));
}

MoELlama::MoELlama(const MoELlamaConfig& c, const DeviceMesh& mesh) : c_(c) {
  c.validate();
  tok_embeddings_ = register_module("tok_embeddings", std::make_shared<Embedding>(c.llama.vocab, c.llama.dim, mesh));
  for (int64_t i = 0; i < c.llama.layers; ++i)
    layers_.push_back(register_module("layers." + std::to_string(i),
                                      std::make_shared<MoEBlock>(c, i < c.dense_layers, mesh)));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(c.llama.dim, mesh, c.llama.norm_eps));
  if (!c.llama.tied_embeddings)
    output_ = register_module("output", std::make_shared<Linear>(c.llama.dim, c.llama.vocab, mesh));
}

DTensor MoELlama::forward(const DTensor& ids) {
  DTensor x = (*tok_embeddings_)(ids);
  for (auto& layer : layers_) x = (*layer)(x);
  x = (*norm_)(x);
  return output_ ? (*output_)(x) : linear(x, tok_embeddings_->weight());
}

DTensor MoELlama::loss(const DTensor& ids, const DTensor& targets) {
  DTensor logits = (*this)(ids);
  const int64_t n = logits.size(0) * logits.size(1);
  DTensor ce = cross_entropy(view(logits, {n, c_.llama.vocab}), view(targets, {n}));
  std::optional<DTensor> aux = moe_aux_loss(*this);
  if (!aux) return ce;
  DTensor a = aux->redistribute(ce.placements());
  // Under mixed precision the router computes in bfloat16 while the logits come in float32.
  if (a.scalar_type() != ce.scalar_type())
    a = DTensor(a.to_local().to(ce.scalar_type()), a.device_mesh(),
                make_spec(a.sizes(), ce.scalar_type(), a.device_mesh(), a.placements()));
  return add(ce, a);
}

}  // namespace hp::nn
