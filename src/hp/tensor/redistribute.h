// Executing redistribution plans on local tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include "hp/comm/device_mesh.h"
#include "hp/layout/redistribute_plan.h"

namespace hp {

// Runs `plan` on this rank's piece (no autograd).
at::Tensor execute_plan(const at::Tensor& local, const RedistributePlan& plan, const DeviceMesh& mesh);

// This rank's piece of `to`, from its piece of `from`; differentiable: the backward
// redistributes the gradient from `to`'s gradient layout back to `from`'s.
at::Tensor redistribute_local(const at::Tensor& local, const ShardSpec& from, const ShardSpec& to,
                              const DeviceMesh& mesh);

// The layout a gradient takes: Partial reads as Replicate. The local gradient of a piece
// is the derivative with respect to that piece: the whole gradient for a P(sum) piece,
// 1/n of it for a P(avg) piece (the factor avg_gradient_scale gives).
ShardSpec gradient_spec(const ShardSpec& spec);
double avg_gradient_scale(const ShardSpec& spec);

// This rank's piece of the full tensor `full` under `spec` (a view for Shard and
// Replicate; Partial(sum) keeps values on coordinate 0 of its mesh dim, zeros elsewhere).
at::Tensor local_piece(const at::Tensor& full, const ShardSpec& spec, const std::vector<int64_t>& coord);

}  // namespace hp
