// DeviceMesh groups and sub-meshes; differentiable collectives against their adjoints.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "rank_data.h"

using namespace hp;
using namespace hp::comm;

TEST(DeviceMesh, SubMeshesAndGroups) {
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{rank / 2, rank % 2}));
    DeviceMesh tp = mesh["tp"];
    EXPECT_EQ(tp.shape().ranks(), (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
    EXPECT_EQ(mesh.group("dp").ranks(), (std::vector<int>{rank % 2, rank % 2 + 2}));
    // The sub-mesh reuses the parent's group: same backend object.
    EXPECT_EQ(&tp.group(0).backend(), &mesh.group(1).backend());
    // Sum of global ranks over tp: {0+1, 2+3}.
    at::Tensor x = at::full({1}, double(rank), at::kDouble);
    all_reduce_(x, tp.group(0));
    EXPECT_EQ(x.item<double>(), rank < 2 ? 1.0 : 5.0);
    DeviceMesh flat = mesh.flatten();
    EXPECT_EQ(flat.dim_names()[0], "dp_tp");
    at::Tensor y = at::ones({1}, at::kLong);
    all_reduce_(y, flat.group(0));
    EXPECT_EQ(y.item<int64_t>(), 4);
    DeviceMesh both = mesh[{"tp", "dp"}];
    EXPECT_EQ(both.shape().dims(), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(both.coordinate(), (std::vector<int64_t>{rank % 2, rank / 2}));
  });
}

TEST(DeviceMesh, ThreeDimsOverUnevenWorld) {
  run_local_ranks(8, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2, 2}, {"pp", "dp", "tp"});
    at::Tensor x = at::ones({1}, at::kLong);
    all_reduce_(x, mesh.group("dp"));
    EXPECT_EQ(x.item<int64_t>(), 2);
  });
}

TEST(DeviceMesh, ErrorsNameTheProblem) {
  run_local_ranks(2, [&](int rank) {
    try {
      init_device_mesh("cpu", {3}, {"dp"});
      ADD_FAILURE();
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds 3 ranks but the world has 2"), std::string::npos);
    }
    DeviceMesh m = init_device_mesh("cpu", {2}, {"dp"});
    EXPECT_THROW(m["tp"], hp::Error);
    EXPECT_THROW(init_device_mesh("tpu", {2}), hp::Error);
  });
}

namespace {

// <A x, y> summed over ranks must equal <x, A^T y> summed over ranks, where A^T y is
// what backward puts in x.grad. Checks that each backward is the adjoint collective.
// A replicated input is one logical tensor: its inner product counts once, not per rank.
void expect_adjoint(const Group& g, const at::Tensor& x0,
                    const std::function<at::Tensor(const at::Tensor&)>& forward, int salt,
                    bool replicated_input = false) {
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor out = forward(x);
  at::Tensor y = rank_input(g.rank(), out.sizes(), at::kDouble, salt);
  (out * y).sum().backward();
  at::Tensor lhs = (out.detach() * y).sum().reshape({1});
  at::Tensor rhs = (x.detach() * x.grad()).sum().reshape({1});
  all_reduce_(lhs, g);
  all_reduce_(rhs, g);
  if (replicated_input) rhs /= g.size();
  EXPECT_NEAR(lhs.item<double>(), rhs.item<double>(), 1e-9);
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

}  // namespace

TEST(AutogradCollectives, BackwardIsTheAdjoint) {
  for (int world : {2, 3, 4}) {
    run_local_ranks(world, [&](int rank) {
      auto g = current_world()->world_group();
      std::vector<int64_t> sizes;
      for (int r = 0; r < world; ++r) sizes.push_back(r + 1);
      at::Tensor xs = rank_input(rank, {3, rank + 1}, at::kDouble);
      expect_adjoint(*g, xs, [&](const at::Tensor& x) { return autograd::all_gather(x, *g, 1, sizes); }, 1);
      at::Tensor xr = rank_input(rank, {7, 2}, at::kDouble);
      expect_adjoint(*g, xr, [&](const at::Tensor& x) { return autograd::reduce_scatter(x, *g, 0); }, 2);
      at::Tensor xa = rank_input(rank, {5, 2 * world}, at::kDouble);
      expect_adjoint(*g, xa, [&](const at::Tensor& x) { return autograd::all_to_all(x, *g, 0, 1); }, 3);
      at::Tensor xp = rank_input(0, {2, 2}, at::kDouble);  // the same on every rank
      expect_adjoint(*g, xp, [&](const at::Tensor& x) { return autograd::all_reduce_sum_backward(x, *g); }, 4,
                     /*replicated_input=*/true);
    });
  }
}

// Over one rank the sum's backward is the identity: the tensor itself, no node, so that its
// gradient reaches the leaf as soon as it exists instead of as a copy held until the node runs.
TEST(AutogradCollectives, SumBackwardOverOneRankIsTheTensorItself) {
  run_local_ranks(1, [](int) {
    auto g = current_world()->world_group();
    at::Tensor w = at::ones({3}, at::kDouble).requires_grad_(true);
    at::Tensor x = w * 2;
    at::Tensor y = autograd::all_reduce_sum_backward(x, *g);
    EXPECT_TRUE(y.is_same(x));
    (y * 3).sum().backward();
    EXPECT_TRUE(at::equal(w.grad(), at::full({3}, 6.0, at::kDouble)));
  });
}

TEST(AutogradCollectives, PartialSumToReplicateGradient) {
  // Each rank holds a partial sum p_r; y = sum_r p_r is replicated and the loss is
  // computed once on y: d loss / d p_r = d loss / d y (identity backward).
  run_local_ranks(3, [&](int rank) {
    auto g = current_world()->world_group();
    at::Tensor p = rank_input(rank, {4}, at::kDouble).requires_grad_(true);
    at::Tensor y = autograd::all_reduce_sum(p, *g);
    at::Tensor w = at::arange(4, at::kDouble);
    (y * w).sum().backward();
    EXPECT_TRUE(at::equal(p.grad(), w));
    at::Tensor want = rank_input(0, {4}, at::kDouble) + rank_input(1, {4}, at::kDouble) +
                      rank_input(2, {4}, at::kDouble);
    EXPECT_TRUE(at::equal(y.detach(), want));
  });
}
