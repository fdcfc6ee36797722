#include "hp/tensor/redistribute.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/autograd.h"
#include "hp/comm/collectives.h"
#include "hp/tensor/flattened_all_to_all.h"
#include "hp/tensor/op_observer.h"

namespace hp {
namespace {

// Extent along `tensor_dim` of every member of this rank's group along `mesh_dim`.
std::vector<int64_t> member_extents(const ShardSpec& spec, std::vector<int64_t> coord, int mesh_dim,
                                    int tensor_dim) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < spec.mesh().dim_size(mesh_dim); ++i) {
    coord[mesh_dim] = i;
    out.push_back(spec.local_shape(coord)[tensor_dim]);
  }
  return out;
}

}  // namespace

at::Tensor execute_plan(const at::Tensor& local, const RedistributePlan& plan, const DeviceMesh& mesh) {
  at::Tensor x = local;
  const std::vector<int64_t> coord = mesh.coordinate();
  for (const RedistributeStep& s : plan.steps) {
    HP_CHECK(x.sizes().vec() == s.from.local_shape(coord))
        << "redistribute step " << s.to_string() << " expects a local piece of shape "
        << to_string_list(s.from.local_shape(coord)) << ", found " << x.sizes();
    switch (s.kind) {
      case StepKind::AllGather:
        x = comm::all_gather(x, mesh.group(s.mesh_dim), s.concat_dim,
                             member_extents(s.from, coord, s.mesh_dim, s.concat_dim));
        break;
      case StepKind::ReduceScatter:
        x = comm::reduce_scatter(x, mesh.group(s.mesh_dim), s.split_dim, s.op,
                                 member_extents(s.to, coord, s.mesh_dim, s.split_dim));
        break;
      case StepKind::AllReduce:
        x = comm::all_reduce(x, mesh.group(s.mesh_dim), s.op);
        break;
      case StepKind::AllToAll:
        x = comm::all_to_all(x, mesh.group(s.mesh_dim), s.split_dim, s.concat_dim,
                             member_extents(s.to, coord, s.mesh_dim, s.split_dim),
                             member_extents(s.from, coord, s.mesh_dim, s.concat_dim));
        break;
      case StepKind::LocalChunk: {
        const int d = s.split_dim;
        const int64_t start = s.to.global_offset(coord)[d] - s.from.global_offset(coord)[d];
        x = x.narrow(d, start, s.to.local_shape(coord)[d]);
        break;
      }
      case StepKind::LocalReduceToPartial:
        if (s.op == ReduceOp::Sum && coord[s.mesh_dim] != 0) x = at::zeros_like(x);
        break;
      case StepKind::LocalScale:
        x = x * s.scale;
        break;
      case StepKind::FlattenedAllToAll:
        x = flattened_all_to_all(x, s, mesh);
        break;
    }
  }
  return x;
}

double avg_gradient_scale(const ShardSpec& spec) {
  double scale = 1;
  for (int k = 0; k < spec.mesh().ndim(); ++k)
    if (spec.placement(k).is_partial() && spec.placement(k).op() == ReduceOp::Avg) scale /= spec.mesh().dim_size(k);
  return scale;
}

ShardSpec gradient_spec(const ShardSpec& spec) {
  std::vector<Placement> p = spec.placements();
  for (auto& q : p)
    if (q.is_partial()) q = Replicate();
  return spec.with_placements(p);
}

// The plan run, with its backward attached (redistribute_local minus the observer).
at::Tensor redistribute_planned(const at::Tensor& local, const ShardSpec& from, const ShardSpec& to,
                                const DeviceMesh& mesh);

at::Tensor redistribute_local(const at::Tensor& local, const ShardSpec& from, const ShardSpec& to,
                              const DeviceMesh& mesh) {
  if (from == to) return local;
  ObservedOp observed;
  observed.from = &from, observed.to = &to;
  const std::vector<at::Tensor> inputs{local};
  observed.inputs = &inputs;
  return observe_op(observed, [&] { return redistribute_planned(local, from, to, mesh); });
}

at::Tensor redistribute_planned(const at::Tensor& local, const ShardSpec& from, const ShardSpec& to,
                                const DeviceMesh& mesh) {
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = execute_plan(local.detach(), *plan_redistribute(from, to, mesh.topology()), mesh);
  }
  // A purely local plan returns a view of the input; the graph needs a tensor of its own.
  if (out.storage().is_alias_of(local.storage())) out = out.clone();
  ShardSpec grad_from = gradient_spec(from), grad_to = gradient_spec(to);
  // A piece of a P(avg) tensor is 1/n of its value, so its gradient is 1/n of the whole
  // gradient: undo that on the way in, apply it on the way out.
  const double scale = avg_gradient_scale(from) / avg_gradient_scale(to);
  return comm::autograd::attach_backward(
      out, local,
      [mesh, grad_from, grad_to, scale](const at::Tensor& grad) {
        at::Tensor g = execute_plan(grad, *plan_redistribute(grad_to, grad_from, mesh.topology()), mesh);
        return scale == 1 ? g : g * scale;
      },
      "RedistributeBackward");
}

at::Tensor local_piece(const at::Tensor& full, const ShardSpec& spec, const std::vector<int64_t>& coord) {
  at::Tensor x = full;
  const auto offset = spec.global_offset(coord);
  const auto shape = spec.local_shape(coord);
  for (int d = 0; d < spec.ndim(); ++d) x = x.narrow(d, offset[d], shape[d]);
  for (int k = 0; k < spec.mesh().ndim(); ++k) {
    const Placement& p = spec.placement(k);
    if (p.is_partial() && p.op() == ReduceOp::Sum && coord[k] != 0) x = at::zeros_like(x);
  }
  return x;
}

}  // namespace hp
