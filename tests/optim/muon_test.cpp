// Muon's pieces: the Newton-Schulz iteration, owners that balance the work, the split
// between Muon and AdamW, and the errors. Distributed Muon against the single-process one
// is in tests/parallel (fully_shard, DistributedDataParallel).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/comm/local_ranks.h"
#include "hp/nn/transformer.h"
#include "hp/optim/chained.h"

using namespace hp;

namespace {
nn::LlamaConfig tiny(int64_t layers) {
  nn::LlamaConfig c;
  c.vocab = 32, c.dim = 16, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 24, c.max_seq = 8;
  return c;
}
}  // namespace

TEST(Muon, NewtonSchulzMakesTheMatrixNearlyOrthogonal) {
  at::manual_seed(0);
  for (auto shape : {std::vector<int64_t>{16, 16}, {8, 32}, {48, 12}}) {
    at::Tensor g = at::randn(shape, at::kFloat);
    at::Tensor x = optim::newton_schulz(g, 5);
    ASSERT_EQ(x.sizes(), g.sizes());
    // The quintic iteration trades exactness for speed: singular values land near 1.
    at::Tensor sv = std::get<1>(at::linalg_svd(x, false));
    EXPECT_GT(sv.min().item<double>(), 0.5) << shape[0] << "x" << shape[1];
    EXPECT_LT(sv.max().item<double>(), 1.3) << shape[0] << "x" << shape[1];
    // It keeps the singular vectors of g: x is close to U V^T of g.
    auto [u, s, vh] = at::linalg_svd(g, false);
    at::Tensor polar = at::matmul(u, vh);
    EXPECT_GT((x * polar).sum().item<double>() / (polar * polar).sum().item<double>(), 0.8);
  }
}

TEST(Muon, OwnersBalanceTheWork) {
  comm::run_local_ranks(4, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {4}, {"dp"});
    nn::Llama model(tiny(4), mesh);
    optim::ChainedOptimizer opt = optim::get_hyper_optimizer(model);
    auto& muon = dynamic_cast<optim::Muon&>(opt.part(0));
    std::vector<double> load(4, 0);
    double total = 0;
    auto params = muon.params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& s = params[i]->sizes();
      const double cost = double(s[0]) * double(s[1]) * double(std::min(s[0], s[1]));
      load[muon.owner(i)] += cost;
      total += cost;
    }
    // 28 matrices of 4 kinds on 4 ranks: greedy balancing leaves every rank near a quarter.
    for (double l : load) EXPECT_NEAR(l, total / 4, total * 0.05);
  });
}

TEST(Muon, GroupsAndShapesAreChecked) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    nn::Llama model(tiny(1), mesh);
    auto named = model.named_parameters();
    std::vector<DTensor*> all = model.parameters();
    // A norm weight is 1-D: not for Muon.
    DTensor* norm = nullptr;
    for (auto& [name, p] : named)
      if (p->dim() == 1) norm = p;
    ASSERT_NE(norm, nullptr);
    EXPECT_THROW(optim::Muon({norm}), hp::Error);
    // Every parameter in exactly one group.
    EXPECT_THROW(optim::get_hyper_optimizer(model, {}, {all.begin(), all.end() - 1}), hp::Error);
    EXPECT_THROW(optim::get_hyper_optimizer(model, {all[0]}, all), hp::Error);
    optim::ChainedOptimizer opt = optim::get_hyper_optimizer(model, optim::MuonOptions{.lr = 0.02}, optim::AdamWOptions{.lr = 1e-3});
    opt.set_lr(0.01);  // half the base: every part follows
    EXPECT_DOUBLE_EQ(opt.part(0).lr(), 0.01);
    EXPECT_DOUBLE_EQ(opt.part(1).lr(), 5e-4);
  });
}
