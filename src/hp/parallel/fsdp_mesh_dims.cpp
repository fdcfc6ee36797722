#include "hp/parallel/fsdp_mesh_dims.h"

#include <algorithm>

#include "hp/base/error.h"

namespace hp::parallel {
namespace {

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

FSDPMeshDims fsdp_mesh_dims(const DeviceMesh& param_mesh, const DeviceMesh& mesh, int dim) {
  const std::string& name = mesh.dim_names()[dim];
  const auto& names = param_mesh.dim_names();
  if (auto it = std::find(names.begin(), names.end(), name); it != names.end()) {
    const int d = static_cast<int>(it - names.begin());
    return {{d}, &param_mesh.group(d)};
  }
  // A flattened dim: the set of the parameters' dims (size-1 ones add no rank) whose
  // group holds the same ranks. Different sets of dims larger than 1 hold different ranks.
  const std::vector<int> ranks = sorted(mesh.group(dim).ranks());
  std::vector<int> wide;
  for (int d = 0; d < param_mesh.ndim(); ++d)
    if (param_mesh.size(d) > 1) wide.push_back(d);
  for (uint32_t subset = 0; subset < (1u << wide.size()); ++subset) {
    std::vector<int> dims;
    for (size_t i = 0; i < wide.size(); ++i)
      if ((subset >> i) & 1u) dims.push_back(wide[i]);
    if (sorted(param_mesh.shape().group_along(param_mesh.rank(), dims)) == ranks) return {dims, &mesh.group(dim)};
  }
  HP_FAIL() << "fully_shard: parameters live on " << param_mesh.to_string() << ", which has no dim '" << name
            << "' of " << mesh.to_string() << " nor dims whose ranks it flattens"
            << " (build the model on a mesh that includes the data-parallel dims)";
  return {};
}

}  // namespace hp::parallel
