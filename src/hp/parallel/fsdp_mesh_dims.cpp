#include "hp/parallel/fsdp_mesh_dims.h"

#include <algorithm>

#include "hp/base/error.h"

namespace hp::parallel {
namespace {

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The dims of `mesh` whose names, joined with '_' in some order, make `name` (as flatten()
// names what it merges), outer first; none when no set does.
std::optional<std::vector<int>> dims_named(const DeviceMesh& mesh, const std::string& name) {
  const int n = mesh.ndim();
  for (uint32_t subset = 1; subset < (1u << n); ++subset) {
    std::vector<int> dims;
    for (int d = 0; d < n; ++d)
      if ((subset >> d) & 1u) dims.push_back(d);
    std::vector<int> order = dims;
    do {
      std::string joined;
      for (size_t i = 0; i < order.size(); ++i) joined += (i ? "_" : "") + mesh.dim_names()[order[i]];
      if (joined == name) return dims;
    } while (std::next_permutation(order.begin(), order.end()));
  }
  return std::nullopt;
}

}  // namespace

FSDPMeshDims fsdp_mesh_dims(const DeviceMesh& param_mesh, const DeviceMesh& mesh, int dim) {
  const std::string& name = mesh.dim_names()[dim];
  const auto& names = param_mesh.dim_names();
  if (auto it = std::find(names.begin(), names.end(), name); it != names.end()) {
    const int d = static_cast<int>(it - names.begin());
    return {{d}, &param_mesh.group(d)};
  }
  const comm::Group& group = mesh.group(dim);
  if (std::optional<std::vector<int>> dims = dims_named(param_mesh, name)) {
    HP_CHECK(sorted(param_mesh.shape().group_along(param_mesh.rank(), *dims)) == sorted(group.ranks()))
        << "fully_shard: mesh dim '" << name << "' of " << mesh.to_string() << " does not hold the ranks of those dims of "
        << param_mesh.to_string();
    return {*dims, &group};
  }
  if (group.size() == 1) return {{}, &group};  // nothing to split
  HP_FAIL() << "fully_shard: parameters live on " << param_mesh.to_string() << ", which has no dim '" << name << "' of "
            << mesh.to_string() << " (build the model on a mesh that includes the data-parallel dims; a flattened "
            << "dim is named by the dims it merges joined with '_', as mesh[{\"dp\", \"ep\"}].flatten() names dp_ep)";
  return {};
}

}  // namespace hp::parallel
