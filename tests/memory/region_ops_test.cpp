// What a full region's recompute leaves out (memory/region_ops.h): a product whose output
// only reaches the region's output through adds gives its backward node alone, with
// at::linear's gradients bitwise; one whose output an op that keeps values reads is
// computed; one read by code the forward's observer does not see is found in the graph,
// and the recompute runs again with it (and the wrapper's region stops leaving it out).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/memory.h"
#include "hp/memory/region_ops.h"
#include "hp/nn.h"
#include "hp/tensor/random.h"

using namespace hp;

namespace {

// x + lin2(act(lin1(x))), where act is tanh (an hp op), or a product of its input with
// itself on local tensors (plain LibTorch: the forward's observer does not see it).
class Residual : public nn::Module {
 public:
  Residual(int64_t dim, const DeviceMesh& mesh, bool unseen_reader) : unseen_reader_(unseen_reader) {
    lin1 = register_module("lin1", std::make_shared<nn::Linear>(dim, dim, mesh));
    lin2 = register_module("lin2", std::make_shared<nn::Linear>(dim, dim, mesh));
  }
  DTensor forward(const DTensor& x) override {
    ++calls;
    DTensor y = (*lin2)(map((*lin1)(x), [](const at::Tensor& t) { return at::tanh(t); }));
    if (unseen_reader_) y = add(y, DTensor(y.to_local() * y.to_local(), y.device_mesh(), y.spec()));
    return add(x, y);
  }
  std::shared_ptr<nn::Linear> lin1, lin2;
  int calls = 0;

 private:
  bool unseen_reader_;
};

struct ResidualRun {
  std::vector<at::Tensor> grads;  // of x and both weights, per step
  std::vector<int> calls;         // forwards per step
  int64_t left_out = 0;
};

ResidualRun run_residual(bool checkpointed, bool unseen_reader) {
  ResidualRun r;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(5);
    Residual m(8, mesh, unseen_reader);
    if (checkpointed) checkpoint_wrapper(m);
    DTensor x = randn({2, 6, 8}, mesh, {Replicate()});
    x.requires_grad_();
    const int64_t before = memory::products_left_out();
    for (int step = 0; step < 2; ++step) {
      m.calls = 0;
      m(x).to_local().pow(2).sum().backward();
      r.calls.push_back(m.calls);
      for (DTensor* p : {&x, m.lin1->parameters()[0], m.lin2->parameters()[0]}) {
        r.grads.push_back(p->to_local().grad().clone());
        p->to_local().mutable_grad().reset();
      }
    }
    r.left_out = memory::products_left_out() - before;
  });
  return r;
}

void expect_bitwise(const ResidualRun& got, const ResidualRun& want) {
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i)
    EXPECT_TRUE(at::equal(got.grads[i], want.grads[i]))
        << "gradient " << i << ": max abs diff " << (got.grads[i] - want.grads[i]).abs().max().item<double>();
}

}  // namespace

// 2-D and 3-D inputs, gradients contiguous or not, and an input without a gradient; an
// input that is a transposed view (autograd's mm backward takes another path for it) is an
// error.
TEST(RegionOps, LinearGraphOnlyGivesAtLinearsGradientsBitwise) {
  at::manual_seed(3);
  for (std::vector<int64_t> sizes : {std::vector<int64_t>{5, 7}, {2, 5, 7}, {3, 64, 96}}) {
    for (int variant = 0; variant < 4; ++variant) {
      const int64_t in = sizes.back(), out = 24;
      at::Tensor x0 = at::randn(sizes), w0 = at::randn({out, in});
      if (variant == 2) {
        std::vector<int64_t> swapped = sizes;
        std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
        x0 = at::randn(swapped).transpose(-1, -2);
      }
      std::vector<int64_t> out_sizes = sizes;
      out_sizes.back() = out;
      at::Tensor g = at::randn(out_sizes);
      if (variant == 1) g = at::randn(out_sizes).transpose(0, -1).contiguous().transpose(0, -1);
      const bool x_grad = variant != 3;
      at::Tensor x1 = x0.clone().requires_grad_(x_grad), w1 = w0.clone().requires_grad_();
      at::Tensor x2 = x0.clone().requires_grad_(x_grad), w2 = w0.clone().requires_grad_();
      at::linear(x1, w1).backward(g);
      if (variant == 2) {
        EXPECT_THROW(memory::linear_graph_only(x2, w2), hp::Error);
        continue;
      }
      at::Tensor y = memory::linear_graph_only(x2, w2);
      EXPECT_EQ(y.sizes(), out_sizes);
      y.backward(g);
      EXPECT_TRUE(at::equal(w1.grad(), w2.grad())) << "weight, sizes " << sizes.size() << "-D, variant " << variant;
      if (x_grad) EXPECT_TRUE(at::equal(x1.grad(), x2.grad())) << "input, variant " << variant;
      else EXPECT_FALSE(x2.grad().defined());
    }
  }
}

// lin2's output only meets the residual add: left out in each step's recompute. lin1's
// output is read by tanh, whose backward keeps its output: computed.
TEST(RegionOps, AProductThatOnlyMeetsAnAddIsLeftOut) {
  const ResidualRun want = run_residual(false, false), got = run_residual(true, false);
  expect_bitwise(got, want);
  EXPECT_EQ(got.left_out, 2);
  EXPECT_EQ(got.calls, (std::vector<int>{2, 2}));  // forward, recompute
}

// lin2's output is also squared on local tensors, unseen by the forward's observer: the
// recompute leaves it out, finds the square's node reading it, and runs again computing it;
// in the next step the wrapper's region computes it at once.
TEST(RegionOps, AReaderTheForwardDidNotSeeRunsTheRecomputeAgain) {
  const ResidualRun want = run_residual(false, true), got = run_residual(true, true);
  expect_bitwise(got, want);
  EXPECT_EQ(got.left_out, 0);
  EXPECT_EQ(got.calls, (std::vector<int>{3, 2}));  // forward, discarded recompute, recompute; then without
}
