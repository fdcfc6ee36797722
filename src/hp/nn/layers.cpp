#include "hp/nn/layers.h"

#include <ATen/ATen.h>

#include <cmath>

#include "hp/tensor/ops.h"
#include "hp/tensor/random.h"

namespace hp::nn {

DTensor init_parameter(const std::vector<int64_t>& shape, const DeviceMesh& mesh, double std) {
  if (initialization_deferred()) {
    ParameterInit init;
    if (std == 0) init.value = 1;
    else init.std = std, init.state = reserve_randn(shape);  // later draws keep their numbers
    return deferred_parameter(shape, mesh, init);
  }
  std::vector<Placement> replicated(mesh.ndim(), Replicate());
  // On the mesh's device: a dry-run's meta mesh builds the model without data.
  if (std == 0) return distribute_tensor(at::ones(shape, tensor_options(mesh)), mesh, replicated);
  DTensor d = hp::randn(shape, mesh, replicated);
  return DTensor(d.to_local() * std, mesh, d.spec());
}

DTensor init_zeros(const std::vector<int64_t>& shape, const DeviceMesh& mesh) {
  if (initialization_deferred()) return deferred_parameter(shape, mesh, ParameterInit{});
  return distribute_tensor(at::zeros(shape, tensor_options(mesh)), mesh, std::vector<Placement>(mesh.ndim(), Replicate()));
}

Linear::Linear(int64_t in, int64_t out, const DeviceMesh& mesh, bool bias)
    : weight_(&register_parameter("weight", init_parameter({out, in}, mesh, 1.0 / std::sqrt(double(in))))) {
  if (bias)
    bias_ = &register_parameter("bias", init_zeros({out}, mesh));
}

DTensor Linear::forward(const DTensor& x) {
  DTensor y = product_ ? product_(x, *weight_) : linear(x, *weight_);
  return bias_ ? add(y, *bias_) : y;
}

Embedding::Embedding(int64_t vocab, int64_t dim, const DeviceMesh& mesh)
    : weight_(&register_parameter("weight", init_parameter({vocab, dim}, mesh, 1.0))) {}

DTensor Embedding::forward(const DTensor& ids) { return embedding(*weight_, ids); }

RMSNorm::RMSNorm(int64_t dim, const DeviceMesh& mesh, double eps)
    : weight_(&register_parameter("weight", init_parameter({dim}, mesh, 0))), eps_(eps) {}

DTensor RMSNorm::forward(const DTensor& x) { return rms_norm(x, *weight_, eps_); }

}  // namespace hp::nn
