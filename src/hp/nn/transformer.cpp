#include "hp/nn/transformer.h"

#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/tensor/fused_cpu.h"
#include "hp/tensor/ops.h"

namespace hp::nn {
namespace {

// A function of whole rows along the last dim (any other dim may stay sharded): the
// softmax rule says exactly that, so it lends its signatures.
DTensor along_last_dim(const char* name, const DTensor& x, const LocalKernel& kernel) {
  return dispatch(Op::softmax(x.dim() - 1).named(name), {x}, kernel);
}

// Each head's halves (x1, x2) rotated by the tables' angles; in one pass where hp::fused
// serves the tensors.
at::Tensor rotate_halves(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (fused::rotary_fusable(x, cos, sin)) return fused::rotary(x, cos, sin);
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> Rotary::tables(int64_t first, int64_t end, int64_t head_dim,
                                                  const at::Tensor& like) {
  const int64_t half = head_dim / 2;
  // float32 tables serve float32 and narrower inputs; float64 inputs get float64 ones.
  const auto wide = like.options().dtype(like.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  if (!cos_.defined() || cos_.size(0) < end || cos_.size(1) != half || cos_.device() != like.device() ||
      cos_.scalar_type() != wide.dtype().toScalarType()) {
    at::Tensor pos = at::arange(end, wide);
    at::Tensor freq = at::pow(theta_, -at::arange(0, half, wide) * (2.0 / head_dim));
    at::Tensor angle = pos.unsqueeze(1) * freq.unsqueeze(0);  // [end, half]
    cos_ = angle.cos();
    sin_ = angle.sin();
  }
  const int64_t n = end - first;
  return {cos_.narrow(0, first, n).to(like.scalar_type()), sin_.narrow(0, first, n).to(like.scalar_type())};
}

DTensor Rotary::operator()(const DTensor& x) {
  return along_last_dim("rotary", x, [this](const std::vector<at::Tensor>& t, const LocalContext& ctx) {
    const at::Tensor& v = t[0];
    const int64_t first = ctx.output.global_offset(ctx.coord)[2];  // positions may be sharded
    auto [cos, sin] = tables(first, first + v.size(2), v.size(-1), v);
    return rotate_halves(v, cos, sin);
  });
}

at::Tensor Rotary::apply(const at::Tensor& x, const at::Tensor& positions) {
  HP_CHECK(positions.dim() == 1 && positions.size(0) == x.size(2))
      << "rotary: " << positions.numel() << " positions for " << x.size(2) << " tokens";
  const int64_t end = positions.numel() ? positions.max().item<int64_t>() + 1 : 0;
  auto [cos, sin] = tables(0, end, x.size(-1), x);
  at::Tensor at_pos = positions.to(x.device());
  cos = cos.index_select(0, at_pos);
  sin = sin.index_select(0, at_pos);
  return rotate_halves(x, cos, sin);
}

DTensor apply_rotary(const DTensor& x, double theta) { return Rotary(theta)(x); }

Attention::Attention(const LlamaConfig& c, const DeviceMesh& mesh)
    : c_(c),
      q_proj_(register_module("q_proj", std::make_shared<Linear>(c.dim, c.heads * c.head_dim(), mesh))),
      k_proj_(register_module("k_proj", std::make_shared<Linear>(c.dim, c.kv_heads * c.head_dim(), mesh))),
      v_proj_(register_module("v_proj", std::make_shared<Linear>(c.dim, c.kv_heads * c.head_dim(), mesh))),
      o_proj_(register_module("o_proj", std::make_shared<Linear>(c.heads * c.head_dim(), c.dim, mesh))),
      rotary_(c.rope_theta) {}

DTensor Attention::forward(const DTensor& x) {
  const int64_t b = x.size(0), s = x.size(1), hd = c_.head_dim();
  auto heads = [&](Linear& proj, int64_t n) { return transpose(view(proj(x), {b, s, n, hd}), 1, 2); };
  DTensor q = heads(*q_proj_, c_.heads), k = heads(*k_proj_, c_.kv_heads), v = heads(*v_proj_, c_.kv_heads);
  DTensor out = core_ ? core_(AttentionCoreInputs{q, k, v, rotary_, c_.causal})
                      : scaled_dot_product_attention(rotary_(q), rotary_(k), v, c_.causal);  // [B, H, S, Dh]
  return (*o_proj_)(view(transpose(out, 1, 2), {b, s, c_.heads * hd}));
}

MLP::MLP(const LlamaConfig& c, const DeviceMesh& mesh)
    : gate_proj_(register_module("gate_proj", std::make_shared<Linear>(c.dim, c.ffn_dim, mesh))),
      up_proj_(register_module("up_proj", std::make_shared<Linear>(c.dim, c.ffn_dim, mesh))),
      down_proj_(register_module("down_proj", std::make_shared<Linear>(c.ffn_dim, c.dim, mesh))) {}

DTensor MLP::forward(const DTensor& x) {
  DTensor gate = (*gate_proj_)(x);  // before up: the order of their hooks' collectives
  return (*down_proj_)(swiglu(gate, (*up_proj_)(x)));
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
  // Through the hooks: a wrapper on the root sees the whole step. [B, S, V] rows, so that a
  // sequence sharded by context parallelism stays sharded into the loss.
  return cross_entropy((*this)(ids), targets);
}

}  // namespace hp::nn
