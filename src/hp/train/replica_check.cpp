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

std::string find_replica_mismatch(const std::vector<std::pair<std::string, DTensor*>>& params, int64_t step) {
  // Meshes in first-appearance order: the same on every rank.
  std::vector<DeviceMesh> meshes;
  for (const auto& [name, p] : params)
    if (std::find(meshes.begin(), meshes.end(), p->device_mesh()) == meshes.end()) meshes.push_back(p->device_mesh());
  for (const DeviceMesh& mesh : meshes) {
    // Checksums of this mesh's parameters that some dim replicates, every rank's from one
    // all-gather; every rank then judges every set of copies alike, so all stop together.
    const comm::Group& everyone = mesh.whole_group();
    if (everyone.size() == 1) continue;
    std::vector<size_t> on_mesh;
    std::vector<int64_t> sums;
    for (size_t i = 0; i < params.size(); ++i) {
      const DTensor& p = *params[i].second;
      if (p.device_mesh() != mesh) continue;
      bool replicated = false;
      for (int d = 0; d < mesh.ndim(); ++d) replicated |= mesh.size(d) > 1 && p.placements()[d].is_replicate();
      on_mesh.push_back(i);
      sums.push_back(replicated ? static_cast<int64_t>(checksum_of(p)) : 0);  // the bits as they are
    }
    const int64_t n = static_cast<int64_t>(sums.size());
    at::Tensor mine = at::tensor(sums, at::kLong).to(tensor_options(mesh, at::kLong).device());
    const at::Tensor all = comm::all_gather(mine, everyone).cpu();  // [ranks * n], rank-major
    const int64_t* v = all.data_ptr<int64_t>();
    std::vector<std::vector<int64_t>> coords;
    for (int r = 0; r < everyone.size(); ++r) coords.push_back(mesh.shape().coord_of(everyone.global_rank(r)));

    for (int64_t k = 0; k < n; ++k) {
      const DTensor& p = *params[on_mesh[k]].second;
      // Ranks that must hold the same copy: those whose coordinates agree on every dim that
      // does not replicate the parameter.
      std::vector<int> kept;
      std::string dims;
      for (int d = 0; d < mesh.ndim(); ++d) {
        if (mesh.size(d) > 1 && p.placements()[d].is_replicate())
          dims += (dims.empty() ? "" : ", ") + mesh.dim_names()[d];
        else
          kept.push_back(d);
      }
      if (dims.empty()) continue;
      std::map<std::vector<int64_t>, std::vector<int>> replica_sets;
      for (int r = 0; r < everyone.size(); ++r) {
        std::vector<int64_t> key;
        for (int d : kept) key.push_back(coords[r][d]);
        replica_sets[key].push_back(r);
      }
      for (const auto& [key, set] : replica_sets) {
        std::vector<uint64_t> copies;
        for (int r : set) copies.push_back(static_cast<uint64_t>(v[r * n + k]));
        const std::vector<int> odd = minority_ranks(copies);
        if (odd.empty()) continue;
        std::vector<int> odd_global, set_global;
        for (int j : odd) odd_global.push_back(everyone.global_rank(set[j]));
        for (int r : set) set_global.push_back(everyone.global_rank(r));
        const std::string& name = params[on_mesh[k]].first;
        std::ostringstream o;
        o << "replica mismatch in " << name << " at step " << step << ": ";
        if (odd.size() == set.size())
          o << "ranks " << rank_list(set_global) << " hold different copies (replicated over " << dims
            << ") and none has a majority";
        else
          o << "rank" << (odd.size() > 1 ? "s " : " ") << rank_list(odd_global) << " differ"
            << (odd.size() > 1 ? "" : "s") << " from the other copies on ranks [" << rank_list(set_global)
            << "] (replicated over " << dims << ")";
        return o.str();
      }
    }
  }
  return "";
}

}  // namespace hp::train
