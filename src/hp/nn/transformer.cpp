#include "hp/nn/transformer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "hp/base/error.h"
#include "hp/tensor/ops.h"

namespace hp::nn {
namespace {

// A function of whole rows along the last dim (any other dim may stay sharded): the
// softmax rule says exactly that, so it lends its signatures.
DTensor along_last_dim(const DTensor& x, const LocalKernel& kernel) {
  return dispatch(Op::softmax(x.dim() - 1), {x}, kernel);
}

}  // namespace

DTensor apply_rotary(const DTensor& x, double theta) {
  return along_last_dim(x, [theta](const std::vector<at::Tensor>& t, const LocalContext& ctx) {
    const at::Tensor& v = t[0];
    const int64_t half = v.size(-1) / 2;
    const int64_t first = ctx.output.global_offset(ctx.coord)[2];  // positions may be sharded
    at::Tensor pos = at::arange(first, first + v.size(2), v.options());
    at::Tensor freq = at::pow(theta, -at::arange(0, half, v.options()) * (2.0 / v.size(-1)));
    at::Tensor angle = pos.unsqueeze(1) * freq.unsqueeze(0);  // [S, half]
    at::Tensor cos = angle.cos(), sin = angle.sin();
    at::Tensor x1 = v.narrow(-1, 0, half), x2 = v.narrow(-1, half, half);
    return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  });
}

DTensor causal_softmax(const DTensor& scores) {
  return along_last_dim(scores, [](const std::vector<at::Tensor>& t, const LocalContext& ctx) {
    const at::Tensor& s = t[0];
    const int64_t first = ctx.output.global_offset(ctx.coord)[2];
    at::Tensor rows = at::arange(first, first + s.size(2), s.options().dtype(at::kLong)).unsqueeze(1);
    at::Tensor cols = at::arange(s.size(3), s.options().dtype(at::kLong)).unsqueeze(0);
    return s.masked_fill(cols > rows, -std::numeric_limits<double>::infinity()).softmax(-1);
  });
}

DTensor repeat_kv(const DTensor& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), s = x.size(2), d = x.size(3);
  // Broadcasting against a [1, 1, rep, 1] zero repeats each head with no copy rule needed.
  DTensor zeros = distribute_tensor(at::zeros({1, 1, rep, 1}, x.to_local().options()),
                                    x.device_mesh(), std::vector<Placement>(x.device_mesh().ndim(), Replicate()));
  return view(add(view(x, {b, kv, 1, s * d}), zeros), {b, kv * rep, s, d});
}

Attention::Attention(const LlamaConfig& c, const DeviceMesh& mesh)
    : c_(c),
      q_proj_(register_module("q_proj", std::make_shared<Linear>(c.dim, c.heads * c.head_dim(), mesh))),
      k_proj_(register_module("k_proj", std::make_shared<Linear>(c.dim, c.kv_heads * c.head_dim(), mesh))),
      v_proj_(register_module("v_proj", std::make_shared<Linear>(c.dim, c.kv_heads * c.head_dim(), mesh))),
      o_proj_(register_module("o_proj", std::make_shared<Linear>(c.heads * c.head_dim(), c.dim, mesh))) {}

DTensor Attention::forward(const DTensor& x) {
  const int64_t b = x.size(0), s = x.size(1), hd = c_.head_dim();
  auto heads = [&](Linear& proj, int64_t n) { return transpose(view(proj(x), {b, s, n, hd}), 1, 2); };
  // Scale q rather than the scores: S / Dh times fewer elements to touch.
  const double scale = 1.0 / std::sqrt(double(hd));
  DTensor q = map(apply_rotary(heads(*q_proj_, c_.heads), c_.rope_theta),
                  [scale](const at::Tensor& t) { return t * scale; });
  DTensor k = repeat_kv(apply_rotary(heads(*k_proj_, c_.kv_heads), c_.rope_theta), c_.heads / c_.kv_heads);
  DTensor v = repeat_kv(heads(*v_proj_, c_.kv_heads), c_.heads / c_.kv_heads);
  DTensor scores = matmul(q, transpose(k, 2, 3));
  DTensor probs = c_.causal ? causal_softmax(scores) : softmax(scores, -1);
  DTensor out = matmul(probs, v);  // [B, H, S, Dh]
  return (*o_proj_)(view(transpose(out, 1, 2), {b, s, c_.heads * hd}));
}

MLP::MLP(const LlamaConfig& c, const DeviceMesh& mesh)
    : gate_proj_(register_module("gate_proj", std::make_shared<Linear>(c.dim, c.ffn_dim, mesh))),
      up_proj_(register_module("up_proj", std::make_shared<Linear>(c.dim, c.ffn_dim, mesh))),
      down_proj_(register_module("down_proj", std::make_shared<Linear>(c.ffn_dim, c.dim, mesh))) {}

DTensor MLP::forward(const DTensor& x) {
  DTensor gate = map((*gate_proj_)(x), [](const at::Tensor& t) { return at::silu(t); });
  return (*down_proj_)(mul(gate, (*up_proj_)(x)));
}

TransformerBlock::TransformerBlock(const LlamaConfig& c, const DeviceMesh& mesh)
    : attn_norm_(register_module("attn_norm", std::make_shared<RMSNorm>(c.dim, mesh, c.norm_eps))),
      mlp_norm_(register_module("mlp_norm", std::make_shared<RMSNorm>(c.dim, mesh, c.norm_eps))),
      attn_(register_module("attn", std::make_shared<Attention>(c, mesh))),
      mlp_(register_module("mlp", std::make_shared<MLP>(c, mesh))) {}

DTensor TransformerBlock::forward(const DTensor& x) {
  DTensor h = add(x, (*attn_)((*attn_norm_)(x)));
  return add(h, (*mlp_)((*mlp_norm_)(h)));
}

Llama::Llama(const LlamaConfig& c, const DeviceMesh& mesh) : c_(c) {
  c.validate();
  tok_embeddings_ = register_module("tok_embeddings", std::make_shared<Embedding>(c.vocab, c.dim, mesh));
  for (int64_t i = 0; i < c.layers; ++i)
    layers_.push_back(register_module("layers." + std::to_string(i), std::make_shared<TransformerBlock>(c, mesh)));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(c.dim, mesh, c.norm_eps));
  if (!c.tied_embeddings) output_ = register_module("output", std::make_shared<Linear>(c.dim, c.vocab, mesh));
}

DTensor Llama::forward(const DTensor& ids) { return forward_embeddings(embed(ids)); }

DTensor Llama::embed(const DTensor& ids) { return (*tok_embeddings_)(ids); }

DTensor Llama::forward_embeddings(const DTensor& h) {
  DTensor x = h;
  for (auto& layer : layers_) x = (*layer)(x);
  x = (*norm_)(x);
  return output_ ? (*output_)(x) : linear(x, tok_embeddings_->weight());
}

DTensor Llama::loss(const DTensor& ids, const DTensor& targets) {
  DTensor logits = (*this)(ids);  // through the hooks: a wrapper on the root sees the whole step
  const int64_t n = logits.size(0) * logits.size(1);
  return cross_entropy(view(logits, {n, c_.vocab}), view(targets, {n}));
}

}  // namespace hp::nn
