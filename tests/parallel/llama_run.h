// Trains the tiny Llama for a few steps on some layout and records what a single-process
// reference must match: the loss of every step, every gradient of the first step (whole
// tensors) and every parameter at the end. The same seed and data on every layout.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "hp/optim/chained.h"
#include "hp/parallel.h"

namespace hp::testing {

struct LlamaRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> first_grads, final_params;
};

inline nn::LlamaConfig tiny_llama() {
  nn::LlamaConfig c;
  c.vocab = 32, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 24, c.max_seq = 8;
  return c;
}

// tiny_llama() with block 1 routing to 2 of 4 experts of width 8 (block 0 stays dense).
inline nn::MoELlamaConfig tiny_moe_llama() {
  nn::MoELlamaConfig c;
  c.llama = tiny_llama();
  c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.aux_loss_coef = 0.01;
  c.moe_hidden_dim = 8, c.dense_layers = 1;
  return c;
}

// The tests' AdamW: lr 1e-2, weight decay 0.1.
inline optim::AdamWOptions adamw_options() {
  optim::AdamWOptions o;
  o.lr = 1e-2, o.weight_decay = 0.1;
  return o;
}

struct LlamaRunSpec {
  std::vector<int64_t> mesh_shape{1};
  std::vector<std::string> mesh_names{"dp"};  // batch rows are split over the dims named dp*
  bool tied = false;
  int64_t batch = 4, seq = 8, steps = 5;
  int micro_steps = 1;  // gradient accumulation: the batch in this many pieces per step
  // Parallelizes the model; may return a switch for gradient sync (accumulation).
  std::function<std::function<void(bool)>(nn::Llama&, const DeviceMesh&)> parallelize;
  std::function<std::unique_ptr<optim::Optimizer>(nn::Llama&)> optimizer = [](nn::Llama& m) {
    return std::make_unique<optim::AdamW>(m.parameters(), adamw_options());
  };
  std::function<void(nn::Llama&, int64_t step)> after_backward;  // inspects the model
  std::function<void(nn::Llama&)> before_final;  // runs before the final parameters are read
  std::function<void(nn::LlamaConfig&)> configure;               // changes tiny_llama()
  // Lays out a batch's ids and targets [B, S] (default: rows split over the dp* dims).
  std::function<std::pair<DTensor, DTensor>(const at::Tensor& ids, const at::Tensor& targets, const DeviceMesh&)>
      shard_batch;
};

// Every rank must see the same run, bitwise (losses, and the full gradients and
// parameters it gathers): a replicated parameter that drifted on one rank is caught here.
// Any run record with losses, first_grads and final_params (LlamaRun, the MoE tests').
template <class Run>
void expect_ranks_agree(const std::vector<Run>& views) {
  for (size_t r = 1; r < views.size(); ++r) {
    EXPECT_EQ(views[r].losses, views[0].losses) << "rank " << r << "'s losses differ from rank 0's";
    for (auto which : {&Run::first_grads, &Run::final_params})
      for (auto& [name, t] : views[0].*which) {
        ASSERT_TRUE((views[r].*which).count(name)) << "rank " << r << " lacks " << name;
        EXPECT_TRUE(at::equal((views[r].*which).at(name), t)) << "rank " << r << "'s " << name << " differs from rank 0's";
      }
  }
}

// Rank 0's view of the run, after checking that every rank's is the same.
inline LlamaRun train_llama(const LlamaRunSpec& spec) {
  std::mutex mu;
  int64_t world = 1;
  for (int64_t s : spec.mesh_shape) world *= s;
  std::vector<LlamaRun> views(world);
  comm::run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", spec.mesh_shape, spec.mesh_names);
    manual_seed(1234);
    nn::LlamaConfig c = tiny_llama();
    c.tied_embeddings = spec.tied;
    if (spec.configure) spec.configure(c);
    nn::Llama model(c, mesh);
    std::function<void(bool)> set_sync;
    if (spec.parallelize) set_sync = spec.parallelize(model, mesh);
    auto opt = spec.optimizer(model);
    std::vector<Placement> rows(mesh.ndim(), Replicate());
    for (int k = 0; k < mesh.ndim(); ++k)
      if (spec.mesh_names[k].rfind("dp", 0) == 0) rows[k] = Shard(0);
    LlamaRun mine;
    // One batch every step: the loss falls for sure, so matching it proves something.
    const at::Tensor tokens = (hp::rand({spec.batch, spec.seq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
    for (int64_t step = 0; step < spec.steps; ++step) {
      double loss_sum = 0;
      const int64_t rows_per_micro = spec.batch / spec.micro_steps;
      for (int micro = 0; micro < spec.micro_steps; ++micro) {
        if (set_sync) set_sync(micro + 1 == spec.micro_steps);
        at::Tensor part = tokens.narrow(0, micro * rows_per_micro, rows_per_micro);
        const at::Tensor part_ids = part.narrow(1, 0, spec.seq).contiguous();
        const at::Tensor part_targets = part.narrow(1, 1, spec.seq).contiguous();
        auto [ids, targets] = spec.shard_batch ? spec.shard_batch(part_ids, part_targets, mesh)
                                               : std::make_pair(distribute_tensor(part_ids, mesh, rows),
                                                                distribute_tensor(part_targets, mesh, rows));
        DTensor loss = model.loss(ids, targets);
        (loss.to_local() / double(spec.micro_steps)).backward();
        loss_sum += loss.full_tensor().item<double>() / double(spec.micro_steps);
      }
      mine.losses.push_back(loss_sum);
      if (spec.after_backward) spec.after_backward(model, step);
      if (step == 0)
        for (auto& [name, p] : model.named_parameters()) mine.first_grads[name] = p->grad()->full_tensor();
      opt->step();
      opt->zero_grad();
    }
    if (spec.before_final) spec.before_final(model);
    for (auto& [name, p] : model.named_parameters()) mine.final_params[name] = p->full_tensor();
    std::lock_guard<std::mutex> lock(mu);
    views[rank] = mine;
  });
  expect_ranks_agree(views);
  return views[0];
}

// float32 on both sides: relative `rtol` with an absolute floor for values near zero
// (`param_atol`, if given, for the final parameters; `atol` otherwise).
inline void expect_runs_match(const LlamaRun& run, const LlamaRun& ref, double rtol = 1e-5, double atol = 1e-6,
                              std::optional<double> param_atol = std::nullopt) {
  ASSERT_EQ(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], rtol * std::abs(ref.losses[i])) << "loss at step " << i;
  // The loss must fall, or the comparison would prove little.
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  auto close = [&](const at::Tensor& got, const at::Tensor& want, double floor, const std::string& what) {
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    EXPECT_TRUE(at::allclose(got.to(at::kFloat), want, rtol, floor))
        << what << ": max abs diff " << (got.to(at::kFloat) - want).abs().max().item<double>();
  };
  for (auto& [name, g] : ref.first_grads) close(run.first_grads.at(name), g, atol, "gradient of " + name);
  for (auto& [name, p] : ref.final_params)
    close(run.final_params.at(name), p, param_atol.value_or(atol), "parameter " + name);
}

}  // namespace hp::testing
