// The planner: any two layouts of one tensor have a plan; its steps chain from one layout
// to the other, each changing one mesh dim or one flattened group of them, and it never
// costs more than the per-mesh-dim plan.
#include <algorithm>
#include <cstdlib>

#include "fuzz/fuzz_input.h"
#include "hp/layout/redistribute_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hp::fuzz::Input in(data, size);
  hp::MeshShape mesh = in.mesh();
  std::vector<int64_t> shape = in.shape();
  const int nd = static_cast<int>(shape.size());
  std::vector<hp::Placement> pa = in.placements(nd, mesh.ndim()), pb = in.placements(nd, mesh.ndim());
  if (!hp::partial_ops_compatible(pa) || !hp::partial_ops_compatible(pb)) return 0;
  hp::ShardSpec a(shape, 4, mesh, pa), b(shape, 4, mesh, pb);
  hp::RedistributePlan p = hp::min_cost_plan(a, b);
  hp::ShardSpec cur = a;
  for (const auto& s : p.steps) {
    if (s.from != cur) std::abort();
    const bool flattened = s.kind == hp::StepKind::FlattenedAllToAll;
    for (int d = 0; d < mesh.ndim(); ++d) {
      const bool stepped = flattened ? std::count(s.mesh_dims.begin(), s.mesh_dims.end(), d) > 0 : d == s.mesh_dim;
      const bool same = s.from.placement(d) == s.to.placement(d);
      if (flattened ? !stepped && !same : stepped == same) std::abort();
    }
    if (flattened && s.from.placements() == s.to.placements()) std::abort();
    for (int r : mesh.ranks())
      for (int64_t x : s.to.local_shape_of_rank(r))
        if (x < 0) std::abort();
    cur = s.to;
  }
  if (cur != b) std::abort();
  if (p.cost.seconds > hp::per_mesh_dim_plan(a, b).cost.seconds * (1 + 1e-9)) std::abort();
  return 0;
}
