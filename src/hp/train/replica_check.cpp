#include "hp/train/replica_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "hp/base/error.h"
#include "hp/checkpoint/format.h"
#include "hp/comm/collectives.h"

namespace hp::train {
namespace {

uint64_t checksum_of(const DTensor& p) {
  at::Tensor local = p.to_local().detach().cpu().contiguous();
  return checkpoint::checksum(local.data_ptr(), local.nbytes());
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? ", " : "") << ranks[i];
  return o.str();
}

}  // namespace

std::vector<int> minority_ranks(const std::vector<uint64_t>& values) {
  std::map<uint64_t, int> count;
  for (uint64_t v : values) ++count[v];
  if (count.size() <= 1) return {};
  std::vector<int> out;
  for (size_t r = 0; r < values.size(); ++r)
    if (2 * count[values[r]] <= static_cast<int>(values.size())) out.push_back(static_cast<int>(r));
  return out;
}

void check_replicas(const std::vector<std::pair<std::string, DTensor*>>& params, int64_t step) {
  // Meshes in first-appearance order: the same on every rank.
  std::vector<DeviceMesh> meshes;
  for (const auto& [name, p] : params)
    if (std::find(meshes.begin(), meshes.end(), p->device_mesh()) == meshes.end()) meshes.push_back(p->device_mesh());
  for (const DeviceMesh& mesh : meshes) {
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (mesh.size(d) == 1) continue;
      std::vector<size_t> replicated;
      std::vector<int64_t> sums;
      for (size_t i = 0; i < params.size(); ++i) {
        const DTensor& p = *params[i].second;
        if (p.device_mesh() != mesh || !p.placements()[d].is_replicate()) continue;
        replicated.push_back(i);
        sums.push_back(static_cast<int64_t>(checksum_of(p)));  // the bits as they are
      }
      if (sums.empty()) continue;
      const comm::Group& group = mesh.group(d);
      const int64_t n = static_cast<int64_t>(sums.size());
      at::Tensor mine = at::tensor(sums, at::kLong).to(tensor_options(mesh, at::kLong).device());
      const at::Tensor all = comm::all_gather(mine, group).cpu();  // [size * n], rank-major
      const int64_t* v = all.data_ptr<int64_t>();
      for (int64_t k = 0; k < n; ++k) {
        std::vector<uint64_t> per_rank;
        for (int r = 0; r < group.size(); ++r) per_rank.push_back(static_cast<uint64_t>(v[r * n + k]));
        const std::vector<int> odd = minority_ranks(per_rank);
        if (odd.empty()) continue;
        std::vector<int> odd_global, all_global;
        for (int r : odd) odd_global.push_back(group.global_rank(r));
        for (int r = 0; r < group.size(); ++r) all_global.push_back(group.global_rank(r));
        const std::string& name = params[replicated[k]].first;
        const std::string& dim = mesh.dim_names()[d];
        if (odd.size() == per_rank.size())
          HP_FAIL() << "replica mismatch in " << name << " at step " << step << ": ranks " << rank_list(all_global)
                    << " hold different copies over " << dim << " and none has a majority";
        HP_FAIL() << "replica mismatch in " << name << " at step " << step << ": rank"
                  << (odd.size() > 1 ? "s " : " ") << rank_list(odd_global) << " differ"
                  << (odd.size() > 1 ? "" : "s") << " from the other ranks of " << dim << " ["
                  << rank_list(all_global) << "]";
      }
    }
  }
}

}  // namespace hp::train
