#include "hp/train/parallel_dims.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::train {
namespace {

const std::vector<std::string> kDims = {"pp", "dp", "ep", "cp", "tp"};

int64_t& degree(ParallelDims& d, const std::string& name) {
  return name == "pp" ? d.pp : name == "dp" ? d.dp : name == "ep" ? d.ep : name == "cp" ? d.cp : d.tp;
}

}  // namespace

ParallelDims ParallelDims::from_mesh(const std::vector<int64_t>& shape, const std::vector<std::string>& names,
                                     const std::string& source) {
  HP_CHECK(!shape.empty() && shape.size() == names.size())
      << source << ": mesh.shape " << to_string_list(shape) << " and mesh.names " << to_string_list(names)
      << " must be non-empty and of equal length";
  ParallelDims d;
  d.order.clear();
  for (size_t i = 0; i < names.size(); ++i) {
    HP_CHECK(std::find(kDims.begin(), kDims.end(), names[i]) != kDims.end())
        << source << ": mesh dim '" << names[i] << "' in " << to_string_list(names)
        << " is not run by the trainer (known: pp, dp, ep, cp, tp)";
    HP_CHECK(std::find(d.order.begin(), d.order.end(), names[i]) == d.order.end())
        << source << ": mesh.names " << to_string_list(names) << " must be distinct and non-empty";
    HP_CHECK(shape[i] >= 1) << source << ": mesh.shape[" << i << "] = " << shape[i] << " must be >= 1";
    d.order.push_back(names[i]);
    degree(d, names[i]) = shape[i];
  }
  // Size 1: where they go does not change any rank's place.
  if (std::find(d.order.begin(), d.order.end(), "pp") == d.order.end()) d.order.push_back("pp");
  if (d.order.size() == 1) d.order.push_back("dp");
  return d;
}

ParallelDims ParallelDims::from_strategy(const plan::Strategy& s) {
  ParallelDims d;  // the planner numbers ranks pp, dp, ep, cp, tp from outermost
  d.pp = s.pp, d.dp = std::max<int64_t>(s.dp, 1), d.ep = std::max<int64_t>(s.ep, 1),
  d.cp = std::max<int64_t>(s.cp, 1), d.tp = s.tp;
  if (s.cp_mode == "hybrid" && d.cp > 1) d.cp_ulysses = s.cp_ulysses;
  d.order = {"pp", "dp"};
  if (d.ep > 1) d.order.push_back("ep");
  if (d.cp > 1) d.order.push_back("cp");
  d.order.push_back("tp");
  return d;
}

int64_t ParallelDims::size(const std::string& name) const {
  HP_CHECK(std::find(kDims.begin(), kDims.end(), name) != kDims.end())
      << "ParallelDims: no dim '" << name << "' (known: pp, dp, ep, cp, tp)";
  return name == "pp" ? pp : name == "dp" ? dp : name == "ep" ? ep : name == "cp" ? cp : tp;
}

std::vector<std::string> ParallelDims::cp_dims() const {
  if (cp_ulysses == 1) return {"cp"};
  return {"cp_ring", "cp_ulysses"};
}

std::vector<int64_t> ParallelDims::mesh_shape() const {
  std::vector<int64_t> shape;
  for (const auto& n : order) {
    if (n == "cp" && cp_ulysses > 1)
      shape.insert(shape.end(), {cp / cp_ulysses, cp_ulysses});
    else
      shape.push_back(size(n));
  }
  return shape;
}

std::vector<std::string> ParallelDims::mesh_names() const {
  std::vector<std::string> names;
  for (const auto& n : order) {
    const std::vector<std::string> split = n == "cp" ? cp_dims() : std::vector<std::string>{n};
    names.insert(names.end(), split.begin(), split.end());
  }
  return names;
}

std::vector<std::string> ParallelDims::stage_dims() const {
  std::vector<std::string> dims;
  for (const auto& n : mesh_names())
    if (n != "pp") dims.push_back(n);
  return dims;
}

std::vector<int64_t> ParallelDims::config_shape() const {
  std::vector<int64_t> shape;
  for (const auto& n : order)
    if (size(n) > 1) shape.push_back(size(n));
  return shape.empty() ? std::vector<int64_t>{1} : shape;
}

std::vector<std::string> ParallelDims::config_names() const {
  std::vector<std::string> names;
  for (const auto& n : order)
    if (size(n) > 1) names.push_back(n);
  return names.empty() ? std::vector<std::string>{"dp"} : names;
}

}  // namespace hp::train
