#include "hp/tensor/meta_ops.h"

#include <ATen/ATen.h>

#include "hp/comm/autograd.h"

namespace hp {

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

at::Tensor both(const at::Tensor& a, const at::Tensor& b) { return a.bitwise_and(b); }

}  // namespace hp
