// A split backward (I, then W) against the full one (B) on the same stage and numbers:
// the input gradient and every parameter gradient bitwise equal, and the work of I + W
// that of one B, counted per product on the activation path and on the weight path
// (before, W ran the activation path again from the stage output).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hp/comm.h"
#include "hp/nn.h"
#include "hp/pipeline.h"
#include "mlp.h"

using namespace hp;

namespace {

// Identity that counts its backward calls: on the activation path it stands for a block's
// input-gradient product, on a weight for its weight-gradient product.
int activation_products = 0, weight_products = 0;
struct Count : torch::autograd::Function<Count> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool weight) {
    ctx->saved_data["weight"] = weight;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    ++(ctx->saved_data["weight"].toBool() ? weight_products : activation_products);
    return {g[0], at::Tensor()};
  }
};

// A middle stage of `blocks` Linear + tanh blocks, each product counted.
pipeline::PipelineStage counted_stage(const Mlp& m, std::shared_ptr<const comm::Group> group) {
  pipeline::PipelineStage st;
  st.stage_index = 1;
  st.num_stages = 3;
  st.parameters = m.params(0, m.blocks());
  st.forward = [p = st.parameters](const at::Tensor& in) {
    at::Tensor x = in;
    for (size_t i = 0; i < p.size(); i += 2) {
      at::Tensor y = at::linear(Count::apply(x, false), Count::apply(p[i], true), p[i + 1]);
      WeightOutputRecorder::record(y, {p[i], p[i + 1]});
      x = at::tanh(y);
    }
    return x;
  };
  st.group = std::move(group);
  return st;
}

struct Grads {
  at::Tensor input;
  std::vector<at::Tensor> params;
  int activation = 0, weight = 0;  // products run
};

// One backward of `st` on (x, dy), full or split.
Grads backward(const pipeline::PipelineStage& st, const at::Tensor& x, const at::Tensor& dy, bool split) {
  pipeline::zero_grad(st);
  pipeline::detail::StageWork w = pipeline::detail::run_forward(st, x, {}, 1.0, split);
  w.grad_output = dy;
  activation_products = weight_products = 0;
  if (split) {
    pipeline::detail::run_backward_input(st, w);
    pipeline::detail::run_backward_weight(st, w);
  } else {
    pipeline::detail::run_backward(st, w);
  }
  Grads g{w.input_grad, {}, activation_products, weight_products};
  for (const auto& p : st.parameters) g.params.push_back(p.grad().clone());
  return g;
}

void expect_equal(const Grads& full, const Grads& split) {
  EXPECT_TRUE(at::equal(full.input, split.input)) << "input gradient";
  ASSERT_EQ(full.params.size(), split.params.size());
  for (size_t i = 0; i < full.params.size(); ++i) EXPECT_TRUE(at::equal(full.params[i], split.params[i])) << "param " << i;
}

}  // namespace

TEST(SplitBackward, InputAndWeightPassesDoOneBackwardsWorkAndMatchItBitwise) {
  Mlp model(4, 8, 3);
  comm::run_local_ranks(1, [&](int) {
    auto st = counted_stage(model, comm::current_world()->world_group());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::Tensor x = at::randn({16, 8}, gen, at::kDouble), dy = at::randn({16, 8}, gen, at::kDouble);
    Grads full = backward(st, x, dy, false), split = backward(st, x, dy, true);
    expect_equal(full, split);
    EXPECT_EQ(full.activation, 4);
    EXPECT_EQ(full.weight, 4);
    EXPECT_EQ(split.activation, full.activation) << "W ran activation-gradient products again";
    EXPECT_EQ(split.weight, full.weight);
  });
}

TEST(SplitBackward, LlamaBlocksMatchTheFullBackwardBitwise) {
  // Modules report their outputs themselves (nn::Module), norms and attention included.
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    nn::LlamaConfig c;
    c.dim = 32, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 64, c.max_seq = 16;
    manual_seed(1);
    auto stage_module = std::make_shared<nn::Sequential>();
    for (int i = 0; i < 2; ++i) stage_module->append("layers." + std::to_string(i), std::make_shared<nn::TransformerBlock>(c, mesh));
    pipeline::MeshStageOptions o;
    o.stage_index = 1;
    o.num_stages = 3;
    o.input_placements = {Replicate()};
    o.forward = [stage_module](const DTensor& x) { return (*stage_module)(x); };
    o.parameters = stage_module->parameters();
    o.group = comm::current_world()->world_group();
    pipeline::PipelineStage st = pipeline::mesh_stage(mesh, o);
    manual_seed(2);
    at::Tensor x = randn({2, 16, 32}, mesh, {Replicate()}).to_local(), dy = randn({2, 16, 32}, mesh, {Replicate()}).to_local();
    expect_equal(backward(st, x, dy, false), backward(st, x, dy, true));
  });
}
