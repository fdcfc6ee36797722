// The MoE's row ops (hp/nn/token_dispatcher.h) against the ATen compositions they stand
// for: the same values and gradients bit for bit, less kept for the backward, and on meta
// tensors (a dry-run) the shapes and gradients a run allocates.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/nn/token_dispatcher.h"
#include "hp/tensor/memory_stats.h"

using namespace hp;

TEST(MoERows, SelectAndPlaceMatchATenBitwise) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({6, 5}), g = at::randn({5, 5});
  const at::Tensor index = at::tensor({4, 0, 4, 2, 5}, at::kLong);  // row 4 twice: its gradients add
  at::Tensor ours = x.clone().requires_grad_(), theirs = x.clone().requires_grad_();
  at::Tensor selected = nn::select_rows(ours, index);
  at::Tensor reference = theirs.index_select(0, index);
  EXPECT_TRUE(at::equal(selected, reference));
  selected.backward(g), reference.backward(g);
  EXPECT_TRUE(at::equal(ours.grad(), theirs.grad()));

  const at::Tensor slots = at::tensor({6, 1, 3, 0, 7}, at::kLong);
  at::Tensor src = g.clone().requires_grad_(), src_ref = g.clone().requires_grad_();
  at::Tensor placed = nn::place_rows(src, slots, 8);
  at::Tensor placed_ref = at::zeros({8, 5}).index_copy(0, slots, src_ref);
  EXPECT_TRUE(at::equal(placed, placed_ref));
  const at::Tensor h = at::randn({8, 5});
  placed.backward(h), placed_ref.backward(h);
  EXPECT_TRUE(at::equal(src.grad(), src_ref.grad()));
}

TEST(MoERows, PlacedRowsKeepOnlyTheIndex) {
  at::Tensor leaf = at::randn({5, 4}).requires_grad_();
  at::Tensor src = leaf * 2;  // not a leaf: only the graph could keep it alive
  const c10::weak_intrusive_ptr<c10::StorageImpl> storage = src.storage().getWeakStorageImpl();
  at::Tensor placed = nn::place_rows(src, at::tensor({1, 3, 0, 6, 2}, at::kLong), 8);
  src.reset();
  EXPECT_TRUE(storage.expired()) << "the placed rows' backward keeps their source";
  placed.sum().backward();
  EXPECT_TRUE(at::equal(leaf.grad(), at::full({5, 4}, 2.0)));
}

TEST(MoERows, WeightedSumMatchesTheProductRuleBitwiseHoldingOneGradientAtATime) {
  track_cpu_memory();
  at::manual_seed(1);
  const int64_t tokens = 512, k = 2, dim = 64;
  const at::Tensor y = at::randn({tokens, k, dim}), w = at::rand({tokens, k}), g = at::randn({tokens, dim});
  // Peak bytes above those allocated before `backward` runs on its output.
  auto backward_peak = [&](at::Tensor& out) {
    const int64_t before = cpu_memory_allocated();
    reset_cpu_memory_peak();
    out.backward(g);
    return cpu_memory_peak() - before;
  };
  at::Tensor y1 = y.clone().requires_grad_(), w1 = w.clone().requires_grad_();
  at::Tensor ours = nn::weighted_sum_of_choices(y1, w1);
  const int64_t our_peak = backward_peak(ours);
  at::Tensor y2 = y.clone().requires_grad_(), w2 = w.clone().requires_grad_();
  at::Tensor product = (y2 * w2.unsqueeze(-1)).sum(1);
  const int64_t product_peak = backward_peak(product);
  EXPECT_TRUE(at::equal(ours, product));
  EXPECT_TRUE(at::equal(y1.grad(), y2.grad()));
  EXPECT_TRUE(at::equal(w1.grad(), w2.grad()));
  const int64_t one = tokens * k * dim * 4;  // one [T, k, D] float tensor
  EXPECT_LT(our_peak, one + one / 4) << "the outputs' gradient, and only small tensors beside it";
  EXPECT_GE(product_peak, 2 * one) << "the product rule holds two (what this op avoids)";
}

TEST(MoERows, MetaShapesAndGradients) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  at::Tensor x = at::empty({6, 5}, meta).requires_grad_();
  const at::Tensor index = at::empty({9}, meta.dtype(at::kLong));
  at::Tensor selected = nn::select_rows(x, index);
  EXPECT_EQ(selected.sizes(), (at::IntArrayRef{9, 5}));
  at::Tensor placed = nn::place_rows(selected, index, 12);
  EXPECT_EQ(placed.sizes(), (at::IntArrayRef{12, 5}));
  at::Tensor weights = at::empty({4, 3}, meta).requires_grad_();
  at::Tensor combined = nn::weighted_sum_of_choices(placed.view({4, 3, 5}), weights);
  EXPECT_EQ(combined.sizes(), (at::IntArrayRef{4, 5}));
  combined.sum().backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
  EXPECT_EQ(weights.grad().sizes(), weights.sizes());
}
