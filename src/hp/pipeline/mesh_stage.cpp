#include "hp/pipeline/mesh_stage.h"

#include <ATen/ATen.h>

#include <optional>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::pipeline {

at::Tensor local_piece(const at::Tensor& whole, const ShardSpec& spec, const std::vector<int64_t>& coord) {
  std::vector<int64_t> offset = spec.global_offset(coord), shape = spec.local_shape(coord);
  at::Tensor t = whole;
  for (int d = 0; d < spec.ndim(); ++d)
    if (shape[d] != whole.size(d)) t = t.narrow(d, offset[d], shape[d]);
  return t;
}

PipelineStage mesh_stage(const DeviceMesh& mesh, MeshStageOptions o) {
  const int s = o.stage_index;
  HP_CHECK(mesh.contains_me()) << "pipeline stage " << s << ": rank " << mesh.rank() << " is not in its mesh "
                               << mesh.to_string();
  HP_CHECK(static_cast<int>(o.input_placements.size()) == mesh.ndim())
      << "pipeline stage " << s << ": " << o.input_placements.size() << " input placements for "
      << mesh.to_string() << " with " << mesh.ndim() << " dims";
  for (const Placement& p : o.input_placements)
    HP_CHECK(!p.is_partial()) << "pipeline stage " << s << ": its input arrives whole, so it can be Shard or "
                              << "Replicate on each mesh dim, not " << p;
  HP_CHECK(o.forward) << "pipeline stage " << s << " has no forward function";

  PipelineStage st;
  st.stage_index = s;
  st.num_stages = o.num_stages;
  st.group = std::move(o.group);
  st.mesh = mesh.shape();
  for (DTensor* p : o.parameters) st.parameters.push_back(p->to_local());
  st.set_requires_gradient_sync = std::move(o.set_requires_gradient_sync);
  st.sync_in_weight_backward = o.sync_in_weight_backward;
  const bool first = s == 0, last = s == o.num_stages - 1;
  st.pieces = !o.output_placements.empty();
  if (st.pieces) {
    HP_CHECK(static_cast<int>(o.output_placements.size()) == mesh.ndim() && !o.activation_shape.empty())
        << "pipeline stage " << s << ": pieces between stages need one output placement per dim of "
        << mesh.to_string() << " and the activation's whole shape";
  }
  auto in_spec = [mesh, placements = o.input_placements](const std::vector<int64_t>& whole, at::ScalarType dtype) {
    return make_spec(whole, dtype, mesh, placements);
  };

  // F and the loss run back to back (run_forward), so the last stage keeps its DTensor
  // output here between them.
  auto last_output = std::make_shared<std::optional<DTensor>>();
  st.forward = [mesh, in_spec, fwd = std::move(o.forward), first, last, last_output, pieces = st.pieces,
                out_placements = o.output_placements, shape = o.activation_shape](const at::Tensor& in) {
    auto input = [&]() -> DTensor {
      if (!pieces || first) {
        ShardSpec spec = in_spec(in.sizes().vec(), in.scalar_type());
        return DTensor(local_piece(in, spec, mesh.coordinate()), mesh, spec);
      }
      // This rank's piece, from the rank at its place in the previous stage's mesh.
      ShardSpec spec = in_spec(shape, in.scalar_type());
      HP_CHECK(in.sizes().vec() == spec.local_shape(mesh.coordinate()))
          << "pipeline stage: received a piece of shape " << in.sizes() << " where its place takes "
          << to_string_list(spec.local_shape(mesh.coordinate())) << " of " << to_string_list(shape);
      return DTensor(in, mesh, spec);
    };
    DTensor out = fwd(input());
    if (!last) return pieces ? out.redistribute(out_placements).to_local() : out.full_tensor();
    *last_output = out;
    return out.to_local();
  };
  if (last) {
    HP_CHECK(o.loss) << "pipeline stage " << s << " is the last of " << o.num_stages << " and needs a loss function";
    st.loss = [s, loss = std::move(o.loss), last_output](const at::Tensor&, const at::Tensor& target) {
      HP_CHECK(last_output->has_value()) << "pipeline stage " << s << ": loss before forward";
      DTensor l = loss(**last_output, target);
      last_output->reset();
      for (const Placement& p : l.placements())
        HP_CHECK(p.is_replicate()) << "pipeline stage " << s << ": the loss must be Replicate on every mesh dim, got "
                                   << l;
      return l.to_local();
    };
  }
  if (!st.pieces)  // with pieces the input's grad is this rank's piece's, which goes back as it is
    st.gather_input_grad = [mesh, in_spec](const at::Tensor& grad) {
      at::NoGradGuard no_grad;
      ShardSpec spec = in_spec(grad.sizes().vec(), grad.scalar_type());
      return DTensor(local_piece(grad, spec, mesh.coordinate()).contiguous(), mesh, spec).full_tensor();
    };
  return st;
}

}  // namespace hp::pipeline
