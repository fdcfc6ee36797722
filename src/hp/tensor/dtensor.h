// DTensor: a local at::Tensor (autograd runs on it) plus the ShardSpec that says which
// piece of the global tensor it is, on which DeviceMesh.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "hp/comm/device_mesh.h"
#include "hp/layout/placement.h"
#include "hp/layout/shard_spec.h"

namespace hp {

class DTensor {
 public:
  // `local` must have the shape `spec` gives this rank.
  DTensor(at::Tensor local, DeviceMesh mesh, ShardSpec spec);

  // Wraps this rank's piece. Without `shape`, shards are taken to be even and the
  // global shape is the local one times the mesh dims sharding each tensor dim.
  static DTensor from_local(at::Tensor local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            std::optional<std::vector<int64_t>> shape = std::nullopt);

  const at::Tensor& to_local() const { return local_; }
  const DeviceMesh& device_mesh() const { return mesh_; }
  const ShardSpec& spec() const { return spec_; }
  const std::vector<Placement>& placements() const { return spec_.placements(); }
  const std::vector<int64_t>& sizes() const { return spec_.shape(); }
  int64_t size(int64_t dim) const;
  int64_t dim() const { return spec_.ndim(); }
  at::ScalarType scalar_type() const { return local_.scalar_type(); }
  bool requires_grad() const { return local_.requires_grad(); }

  // Differentiable: the gradient comes back in this tensor's layout.
  DTensor redistribute(std::vector<Placement> placements) const;
  at::Tensor full_tensor() const;  // the global tensor on every rank (differentiable)

  // The gradient of the whole tensor, laid out as this tensor is (Partial read as
  // Replicate: every rank holds the whole gradient there).
  std::optional<DTensor> grad() const;
  DTensor detach() const;
  DTensor& requires_grad_(bool on = true);

  // Mesh dims over which ops leave the gradient of this (replicated) tensor as per-rank
  // partial sums instead of all-reducing it at each use: a data-parallel wrapper
  // (fully_shard, DistributedDataParallel) reduces them itself, fused and overlapped with
  // backward. Results of ops never carry the mark.
  DTensor& defer_grad_reduction(const std::vector<int>& mesh_dims);
  bool defers_grad_reduction(int mesh_dim) const { return (deferred_grad_dims_ >> mesh_dim) & 1u; }

  std::string to_string() const;

 private:
  at::Tensor local_;
  DeviceMesh mesh_;
  ShardSpec spec_;
  uint32_t deferred_grad_dims_ = 0;
};

std::ostream& operator<<(std::ostream& os, const DTensor& t);

// The spec of a tensor of `shape` and `dtype` laid out on `mesh`.
ShardSpec make_spec(const std::vector<int64_t>& shape, at::ScalarType dtype, const DeviceMesh& mesh,
                    std::vector<Placement> placements);

// Options for new tensors on `mesh`: its device type ("cpu", "cuda", or "meta" for a
// dry-run, where tensors have shapes and no data).
at::TensorOptions tensor_options(const DeviceMesh& mesh, at::ScalarType dtype = at::kFloat);

// A parameter made inside nn::no_init_parameters() and not drawn yet: meta storage on a
// mesh of real devices.
bool awaits_init(const DTensor& t);
// The refusal of one: "<what> was made inside nn::no_init_parameters() and is not drawn
// yet: call nn::init_parameters(model) <when>".
std::string not_drawn_yet(const std::string& what, const std::string& when);

// Spreads a full tensor over `mesh`. With src_rank < 0 every rank passes the same tensor;
// otherwise rank `src_rank`'s tensor is broadcast first (the others may pass an undefined
// tensor). Partial placements keep the values on coordinate 0 of that mesh dim (sum) or
// everywhere (avg, max, min).
DTensor distribute_tensor(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                          int src_rank = -1);

}  // namespace hp
