// AdamW and Muon on one rank against their update rules written out here, element by
// element or matrix by matrix, over three steps: a missing bias correction, a wrong
// weight-decay order or one Newton-Schulz iteration fewer all show.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "hp/comm/local_ranks.h"
#include "hp/optim/adamw.h"
#include "hp/optim/muon.h"
#include "hp/tensor.h"

using namespace hp;

namespace {

// Three gradients for a parameter of `shape`, drawn once.
std::vector<at::Tensor> gradients(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  std::vector<at::Tensor> g;
  for (int k = 0; k < 3; ++k) g.push_back(hp::randn(shape, at::kDouble).to(dtype));
  return g;
}

// Runs `make_optimizer` over a parameter starting at `init` with `grads`; the parameter
// after each step.
template <typename Make>
std::vector<at::Tensor> run_steps(const at::Tensor& init, const std::vector<at::Tensor>& grads, Make make_optimizer) {
  std::vector<at::Tensor> out;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1});
    DTensor p = distribute_tensor(init.clone(), mesh, {Replicate()});
    p.requires_grad_(true);
    auto opt = make_optimizer(std::vector<DTensor*>{&p});
    for (const at::Tensor& g : grads) {
      p.to_local().mutable_grad() = g.clone();
      opt->step();
      opt->zero_grad();
      out.push_back(p.to_local().detach().clone());
    }
  });
  return out;
}

}  // namespace

TEST(OptimizerFormulas, AdamWIsDecoupledDecayPlusBiasCorrectedMoments) {
  manual_seed(5);
  const at::Tensor init = hp::randn({5, 3}, at::kDouble);
  const auto grads = gradients({5, 3}, at::kDouble);
  optim::AdamWOptions o;
  o.lr = 0.05, o.beta1 = 0.8, o.beta2 = 0.9, o.eps = 1e-3, o.weight_decay = 0.2;
  const auto got = run_steps(init, grads, [&](std::vector<DTensor*> ps) {
    return std::make_unique<optim::AdamW>(ps, o);
  });
  const double* g0 = init.data_ptr<double>();
  for (int64_t i = 0; i < init.numel(); ++i) {
    double p = g0[i], m = 0, v = 0;
    for (int t = 1; t <= 3; ++t) {
      const double g = grads[t - 1].data_ptr<double>()[i];
      m = o.beta1 * m + (1 - o.beta1) * g;
      v = o.beta2 * v + (1 - o.beta2) * g * g;
      const double m_hat = m / (1 - std::pow(o.beta1, t)), v_hat = v / (1 - std::pow(o.beta2, t));
      p = p * (1 - o.lr * o.weight_decay) - o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
      EXPECT_NEAR(got[t - 1].data_ptr<double>()[i], p, 1e-12) << "element " << i << " after step " << t;
    }
  }
}

namespace {

// Muon's update direction for one matrix, in float64: Nesterov momentum, then five
// iterations of X <- a X + (b A + c A^2) X with A = X X^T on the wide orientation scaled
// to unit norm, scaled by sqrt(max(1, rows / cols)).
at::Tensor muon_direction(const at::Tensor& update, int steps) {
  const bool tall = update.size(0) > update.size(1);
  at::Tensor x = tall ? update.t() : update;
  x = x / (x.norm() + 1e-7);
  for (int i = 0; i < steps; ++i) {
    at::Tensor a = at::matmul(x, x.t());
    x = 3.4445 * x + at::matmul(-4.7750 * a + 2.0315 * at::matmul(a, a), x);
  }
  if (tall) x = x.t();
  return x * std::sqrt(std::max(1.0, double(update.size(0)) / double(update.size(1))));
}

}  // namespace

TEST(OptimizerFormulas, MuonIsNesterovMomentumThroughFiveNewtonSchulzIterations) {
  for (auto shape : {std::vector<int64_t>{6, 4}, {3, 5}}) {
    manual_seed(6);
    const at::Tensor init = hp::randn(shape, at::kDouble).to(at::kFloat);
    const auto grads = gradients(shape, at::kFloat);
    optim::MuonOptions o;
    o.lr = 0.03, o.momentum = 0.9, o.nesterov = true, o.ns_steps = 5, o.weight_decay = 0.1;
    const auto got = run_steps(init, grads, [&](std::vector<DTensor*> ps) {
      return std::make_unique<optim::Muon>(ps, o);
    });
    at::Tensor p = init.to(at::kDouble), buf = at::zeros_like(p);
    for (int t = 0; t < 3; ++t) {
      const at::Tensor g = grads[t].to(at::kDouble);
      buf = o.momentum * buf + g;
      p = p * (1 - o.lr * o.weight_decay) - o.lr * muon_direction(g + o.momentum * buf, 5);
      // float32 products inside Muon: agreement to float32 rounding, far below what one
      // iteration more or less changes.
      const double err = (got[t].to(at::kDouble) - p).abs().max().item<double>();
      EXPECT_LT(err, 2e-6) << shape[0] << "x" << shape[1] << " after step " << t + 1;
      if (t == 0) {
        const at::Tensor four = init.to(at::kDouble) * (1 - o.lr * o.weight_decay) -
                                o.lr * muon_direction(g + o.momentum * buf, 4);
        EXPECT_GT((four - p).abs().max().item<double>(), 100 * 2e-6) << "the tolerance could not tell 4 from 5";
      }
    }
  }
}
