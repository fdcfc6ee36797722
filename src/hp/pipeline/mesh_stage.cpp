#include "hp/pipeline/mesh_stage.h"

#include <ATen/ATen.h>

#include <optional>

#include "hp/base/error.h"

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
  const bool last = s == o.num_stages - 1;
  auto in_spec = [mesh, placements = o.input_placements](const at::Tensor& whole) {
    return make_spec(whole.sizes().vec(), whole.scalar_type(), mesh, placements);
  };

  // F and the loss run back to back (run_forward), so the last stage keeps its DTensor
  // output here between them.
  auto last_output = std::make_shared<std::optional<DTensor>>();
  st.forward = [mesh, in_spec, fwd = std::move(o.forward), last, last_output](const at::Tensor& whole) {
    ShardSpec spec = in_spec(whole);
    DTensor out = fwd(DTensor(local_piece(whole, spec, mesh.coordinate()), mesh, spec));
    if (!last) return out.full_tensor();
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
  st.gather_input_grad = [mesh, in_spec](const at::Tensor& grad) {
    at::NoGradGuard no_grad;
    ShardSpec spec = in_spec(grad);
    return DTensor(local_piece(grad, spec, mesh.coordinate()).contiguous(), mesh, spec).full_tensor();
  };
  return st;
}

}  // namespace hp::pipeline
