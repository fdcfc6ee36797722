// Shared checks for DTensor tests: an op on DTensors against the same op on full tensors.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <random>
#include <vector>

#include "hp/tensor.h"

namespace hp::testing {

inline bool close(const at::Tensor& a, const at::Tensor& b, double rtol = 1e-10) {
  if (a.sizes() != b.sizes()) return false;
  return at::allclose(a.to(at::kDouble), b.to(at::kDouble), rtol, rtol);
}

// A random placement of a tensor with `ndim` dims: Shard of any dim, Replicate or Partial(sum).
inline Placement random_placement(std::mt19937& rng, int ndim, bool allow_partial = true) {
  std::uniform_int_distribution<int> pick(0, ndim + (allow_partial ? 1 : 0));
  int k = pick(rng);
  if (k < ndim) return Shard(k);
  return k == ndim ? Replicate() : Partial();
}

inline std::vector<Placement> random_placements(std::mt19937& rng, int mesh_ndim, int ndim,
                                                bool allow_partial = true) {
  std::vector<Placement> p;
  for (int k = 0; k < mesh_ndim; ++k) p.push_back(random_placement(rng, ndim, allow_partial && ndim > 0));
  return p;
}

// Runs `dop` on DTensors laid out as `placements` and `ref` on the full tensors; compares
// the outputs and the gradients of a weighted sum of the output (float inputs only).
inline void expect_op_matches(const DeviceMesh& mesh, const std::vector<at::Tensor>& fulls,
                              const std::vector<std::vector<Placement>>& placements,
                              const std::function<DTensor(const std::vector<DTensor>&)>& dop,
                              const std::function<at::Tensor(const std::vector<at::Tensor>&)>& ref,
                              const std::string& what) {
  std::vector<DTensor> ins;
  std::vector<at::Tensor> ref_ins;
  std::string layout;
  for (size_t i = 0; i < fulls.size(); ++i) {
    DTensor d = distribute_tensor(fulls[i], mesh, placements[i]);
    at::Tensor r = fulls[i].clone();
    if (at::isFloatingType(fulls[i].scalar_type())) {
      d.requires_grad_(true);
      r.requires_grad_(true);
    }
    ins.push_back(d);
    ref_ins.push_back(r);
    layout += " " + to_string_list(placements[i]);
  }
  SCOPED_TRACE(what + " with inputs" + layout);
  DTensor out = dop(ins);
  at::Tensor want = ref(ref_ins);
  at::Tensor got = out.full_tensor();
  ASSERT_TRUE(close(got, want)) << "output differs\n got " << got << "\n want " << want;
  // Same weights on every rank: the loss is one logical value.
  at::Tensor w = at::arange(want.numel(), at::kDouble).reshape(want.sizes()).remainder(7).sub(3).to(want.scalar_type());
  (got * w).sum().backward();
  (want * w).sum().backward();
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ref_ins[i].requires_grad()) continue;
    auto g = ins[i].grad();
    ASSERT_TRUE(g.has_value()) << "no gradient for input " << i;
    at::Tensor full_grad = g->full_tensor();
    EXPECT_TRUE(close(full_grad, ref_ins[i].grad())) << "gradient of input " << i << " differs\n got "
                                                     << full_grad << "\n want " << ref_ins[i].grad();
  }
}

}  // namespace hp::testing
