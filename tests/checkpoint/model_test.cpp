// A tensor-parallel Llama and its AdamW state saved at dp=2 x tp=2 and loaded on one rank
// and at tp=4: every parameter and state tensor equals the full tensor of the saved run.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "hp/checkpoint.h"
#include "hp/optim/adamw.h"
#include "hp/parallel.h"
#include "fixtures.h"

using namespace hp;
using namespace hp::checkpoint;

namespace {

nn::LlamaConfig tiny() {
  nn::LlamaConfig c;
  c.vocab = 32, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 4, c.ffn_dim = 24, c.max_seq = 8;
  return c;
}

using Tensors = std::map<std::string, at::Tensor>;

// Full tensors of every parameter ("model.") and optimizer state ("optim.").
Tensors full_state(nn::Llama& model, optim::Optimizer& opt) {
  Tensors out;
  auto named = model.named_parameters();
  for (auto& [name, p] : named) out["model." + name] = p->full_tensor();
  std::map<const DTensor*, std::string> names;
  for (auto& [name, p] : named) names[p] = name;
  for (auto& s : opt.state())
    out["optim." + names[s.param] + "." + s.name] =
        DTensor(*s.local, s.param->device_mesh(), s.param->spec()).full_tensor();
  return out;
}

void train_steps(nn::Llama& model, optim::Optimizer& opt, const DeviceMesh& mesh, int steps) {
  for (int k = 0; k < steps; ++k) {
    at::Tensor tokens = (hp::rand({4, 9}, at::kDouble) * 32).floor().to(at::kLong);
    std::vector<Placement> rows(mesh.ndim(), Replicate());
    rows[0] = Shard(0);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, rows);
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, rows);
    model.loss(ids, targets).to_local().backward();
    opt.step();
    opt.zero_grad();
  }
}

// Builds the model on (dp, tp), loads the latest checkpoint, returns its full state.
Tensors load_on(const std::string& root, int64_t dp, int64_t tp, int64_t* steps) {
  std::vector<Tensors> out(dp * tp);
  std::vector<int64_t> rank_steps(dp * tp);
  comm::run_local_ranks(static_cast<int>(dp * tp), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {dp, tp}, {"dp", "tp"});
    manual_seed(99);  // other initial values than the saved run: loading must replace them
    nn::Llama model(tiny(), mesh);
    if (tp > 1) parallelize_llama(model, mesh["tp"], {false, true});
    optim::AdamW opt(model.parameters());
    State s;
    s.add_module(model);
    s.add_optimizer(opt, model.named_parameters());
    ASSERT_TRUE(Checkpointer(CheckpointOptions{root}).load_latest(s).has_value());
    opt.set_steps(s.scalars.at("optim.steps"));
    out[rank] = full_state(model, opt);
    rank_steps[rank] = opt.steps();
  });
  for (int64_t s : rank_steps) EXPECT_EQ(s, rank_steps[0]);
  *steps = rank_steps[0];
  return hp::testing::same_on_every_rank(out);
}

}  // namespace

TEST(CheckpointModel, LlamaAndAdamWFromDpTpToOneRankAndTp4) {
  const auto root = hp::testing::fresh_dir("model");
  std::vector<Tensors> saved_by(4);
  comm::run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    manual_seed(7);
    nn::Llama model(tiny(), mesh);
    parallelize_llama(model, mesh["tp"], {false, true});
    optim::AdamWOptions o;
    o.lr = 1e-2;
    optim::AdamW opt(model.parameters(), o);
    train_steps(model, opt, mesh, 2);
    State s;
    s.add_module(model);
    s.add_optimizer(opt, model.named_parameters());
    s.scalars["optim.steps"] = opt.steps();
    Checkpointer(CheckpointOptions{root, 1, /*async=*/true}).save(2, s);
    saved_by[rank] = full_state(model, opt);
  });
  const Tensors saved = hp::testing::same_on_every_rank(saved_by);
  // 9 parameters per layer, 3 outside the layers; each with exp_avg and exp_avg_sq.
  ASSERT_EQ(static_cast<int64_t>(saved.size()), (9 * tiny().layers + 3) * 3);
  for (auto [dp, tp] : {std::pair<int64_t, int64_t>{1, 1}, {1, 4}}) {
    int64_t steps = 0;
    Tensors loaded = load_on(root, dp, tp, &steps);
    EXPECT_EQ(steps, 2);
    ASSERT_EQ(loaded.size(), saved.size());
    for (const auto& [name, t] : saved)
      EXPECT_TRUE(at::equal(loaded.at(name), t)) << name << " loaded at dp=" << dp << " tp=" << tp;
  }
}
