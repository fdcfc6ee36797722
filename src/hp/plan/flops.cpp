#include "hp/plan/flops.h"

namespace hp::plan {

namespace {

double layer_matmul_params(const ModelDesc& m, bool moe) {
  const double h = m.hidden;
  double attn = 2 * h * m.q_dim() + 2 * h * m.kv_dim();
  if (!moe) return attn + 3 * h * m.ffn;
  return attn + h * m.experts + double(m.top_k + m.shared_experts) * 3 * h * m.moe_ffn;
}

}  // namespace

double attention_flops_per_token(const ModelDesc& m) { return 2.0 * m.seq_len * m.q_dim(); }

double layer_forward_flops_per_token(const ModelDesc& m, bool moe) {
  return 2 * layer_matmul_params(m, moe) + attention_flops_per_token(m);
}

double recomputed_layer_flops_per_token(const ModelDesc& m, bool moe) {
  const double down = moe ? double(m.shared_experts) * m.moe_ffn : double(m.ffn);
  return layer_forward_flops_per_token(m, moe) - 2.0 * m.hidden * down;
}

double head_forward_flops_per_token(const ModelDesc& m) { return 2.0 * m.hidden * m.vocab; }

double forward_flops_per_token(const ModelDesc& m) {
  const double dense = double(m.layers - m.moe_layers());
  return dense * layer_forward_flops_per_token(m, false) + m.moe_layers() * layer_forward_flops_per_token(m, true) +
         head_forward_flops_per_token(m);
}

}  // namespace hp::plan
