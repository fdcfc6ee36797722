#include "hp/tensor/meta_ops.h"

#include <ATen/ATen.h>

#include <torch/csrc/autograd/custom_function.h>

#include "hp/comm/autograd.h"

namespace hp {
namespace {

struct MetaAttention : torch::autograd::Function<MetaAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    ctx->save_for_backward({q, k, v});
    return at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list) {
    auto saved = ctx->get_saved_variables();
    return {at::empty_like(saved[0]), at::empty_like(saved[1]), at::empty_like(saved[2])};
  }
};

}  // namespace

at::Tensor embedding_lookup(const at::Tensor& table, const at::Tensor& ids) {
  if (!table.is_meta()) return at::embedding(table, ids);
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(table.size(1));
  const std::vector<int64_t> table_shape = table.sizes().vec();
  return comm::autograd::attach_backward(
      at::empty(shape, table.options()), table,
      [table_shape](const at::Tensor& grad) { return at::empty(table_shape, grad.options()); },
      "MetaEmbeddingBackward");
}

at::Tensor gather_last(const at::Tensor& x, const at::Tensor& index) {
  if (!x.is_meta()) return x.gather(-1, index);
  const std::vector<int64_t> shape = x.sizes().vec();
  return comm::autograd::attach_backward(
      at::empty(index.sizes(), x.options()), x,
      [shape](const at::Tensor& grad) { return at::zeros(shape, grad.options()); }, "MetaGatherBackward");
}

at::Tensor both(const at::Tensor& a, const at::Tensor& b) { return a.bitwise_and(b); }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, bool causal, std::optional<double> scale) {
  if (q.is_meta()) return MetaAttention::apply(q, k, v);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, /*enable_gqa=*/q.size(1) != k.size(1));
}

}  // namespace hp
