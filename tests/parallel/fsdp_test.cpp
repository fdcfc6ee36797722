// fully_shard (FSDP, HSDP, with tensor parallelism, gradient accumulation, mixed precision)
// against the single-process model on the same numbers: loss every step, every gradient
// of the first step, every parameter after 5 optimizer steps. float32: relative 1e-5.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "parallel/llama_run.h"
#include "comm/scoped_env.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

const LlamaRun& reference() {
  static LlamaRun ref = hp::testing::train_llama({});
  return ref;
}

LlamaRunSpec fsdp_spec(std::vector<int64_t> shape, std::vector<std::string> names, FullyShardOptions o = {}) {
  LlamaRunSpec spec;
  spec.mesh_shape = shape, spec.mesh_names = names;
  spec.parallelize = [names, o](nn::Llama& model, const DeviceMesh& mesh) {
    const bool hsdp = names[0] == "dp_rep";
    const bool tp = names.back() == "tp";
    if (tp) parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, /*loss_parallel=*/true});
    FSDPModule root = fully_shard_llama(model, hsdp ? mesh[{"dp_rep", "dp_shard"}] : mesh["dp"], o);
    return std::function<void(bool)>([root](bool on) mutable { root.set_requires_gradient_sync(on); });
  };
  return spec;
}

}  // namespace

TEST(FullyShard, Fsdp4) { hp::testing::expect_runs_match(hp::testing::train_llama(fsdp_spec({4}, {"dp"})), reference()); }
// 3 ranks split dims of 16, 24 and 32 unevenly.
TEST(FullyShard, Fsdp3Uneven) {
  LlamaRunSpec spec = fsdp_spec({3}, {"dp"});
  spec.batch = 3;
  LlamaRunSpec ref;
  ref.batch = 3;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), hp::testing::train_llama(ref));
}
TEST(FullyShard, Hsdp2x2) {
  hp::testing::expect_runs_match(hp::testing::train_llama(fsdp_spec({2, 2}, {"dp_rep", "dp_shard"})), reference());
}
TEST(FullyShard, FsdpTimesTensorParallel) {
  hp::testing::expect_runs_match(hp::testing::train_llama(fsdp_spec({2, 2}, {"dp", "tp"})), reference());
}
TEST(FullyShard, NoPrefetchNoReshardSameNumbers) {
  FullyShardOptions o;
  o.prefetch = false;
  o.reshard_after_forward = false;
  hp::testing::expect_runs_match(hp::testing::train_llama(fsdp_spec({2}, {"dp"}, o)), reference());
}

// The send buffers live in the shard group's symmetric heap, and with 4 KiB steps
// (HP_SHM_STEP_KIB) every unit's all-gather and reduce-scatter read them in place.
TEST(FullyShard, SymmetricSendBuffersReadInPlace) {
  for (int world : {2, 3}) {
    LlamaRunSpec spec = fsdp_spec({world}, {"dp"});
    spec.batch = 6;
    LlamaRunSpec ref;
    ref.batch = 6;
    LlamaRun run;
    {
      ScopedEnv small("HP_SHM_STEP_KIB", "4");
      run = hp::testing::train_llama(spec);
    }
    hp::testing::expect_runs_match(run, hp::testing::train_llama(ref));
  }
}

// Four micro-steps of a quarter of the batch, communicating only on the last, equal one
// step on the whole batch.
TEST(FullyShard, GradientAccumulationEqualsLargeBatch) {
  LlamaRunSpec spec = fsdp_spec({2}, {"dp"});
  spec.batch = 8;
  spec.micro_steps = 4;
  LlamaRunSpec ref;
  ref.batch = 8;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), hp::testing::train_llama(ref));
}

// ZeRO stages 1-3 driven over four micro-steps as the trainer's pipeline drives them
// (prepare_zero_backward before each), on 2 ranks and on 3 (uneven shards): the same
// numbers as one step on the whole batch.
LlamaRunSpec zero_spec(int world, int stage) {
  LlamaRunSpec spec;
  spec.mesh_shape = {world};
  spec.batch = 4 * world, spec.micro_steps = 4;
  spec.parallelize = [stage](nn::Llama& model, const DeviceMesh& mesh) {
    FSDPModule root = fully_shard_llama(model, mesh["dp"], zero_stage_options(stage));
    return std::function<void(bool)>([root, stage](bool last) mutable { prepare_zero_backward(root, stage, last); });
  };
  return spec;
}
TEST(FullyShard, ZeroStagesWithAccumulationEqualLargeBatch) {
  for (int world : {2, 3}) {
    LlamaRunSpec ref;
    ref.batch = 4 * world;
    const LlamaRun want = hp::testing::train_llama(ref);
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", ZeRO-" + std::to_string(stage));
      hp::testing::expect_runs_match(hp::testing::train_llama(zero_spec(world, stage)), want);
    }
  }
}

// What each stage communicates over one step of four micro-steps of the 2-block model (3
// units: two blocks and the root), counted by the collective log, and whether parameters
// stay gathered between micro-steps. ZeRO-1: each unit gathered once and reduced once;
// ZeRO-2: reduced every micro-step; ZeRO-3: the blocks gathered again for backward (the
// root keeps its parameters from forward to backward) every micro-step.
TEST(FullyShard, ZeroStagesGatherReduceAndHoldAsDocumented) {
  struct Want {
    int stage, gathers, reductions;
    bool held_between;
  };
  for (Want w : {Want{1, 3, 3, true}, Want{2, 3, 12, true}, Want{3, 4 * 5, 12, false}}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(w.stage));
    std::mutex mu;
    std::map<const nn::Module*, FSDPModule> roots;  // each rank's
    LlamaRunSpec spec = zero_spec(2, w.stage);
    spec.steps = 1;
    spec.parallelize = [&, w](nn::Llama& model, const DeviceMesh& mesh) {
      FSDPModule root = fully_shard_llama(model, mesh["dp"], zero_stage_options(w.stage));
      {
        std::lock_guard<std::mutex> lock(mu);
        roots.emplace(&model, root);
      }
      comm::current_world()->collective_log().enable();
      auto micro = std::make_shared<int>(0);
      return std::function<void(bool)>([root, w, micro](bool last) mutable {
        // Before micro-steps 2-4: what the previous backward left gathered.
        if ((*micro)++ > 0) EXPECT_EQ(root.unsharded_bytes() > 0, w.held_between) << "before micro-step " << *micro;
        prepare_zero_backward(root, w.stage, last);
      });
    };
    spec.after_backward = [&, w](nn::Llama& model, int64_t) {
      std::unique_lock<std::mutex> lock(mu);
      const FSDPModule root = roots.at(&model);
      lock.unlock();
      EXPECT_EQ(root.unsharded_bytes(), 0) << "a gather outlives the step's last backward";
      int gathers = 0, reductions = 0;
      for (const auto& r : comm::current_world()->collective_log().records()) {
        gathers += r.op == "all_gather" && r.numel > 16;  // not the loss's
        reductions += r.op == "reduce_scatter";
      }
      EXPECT_EQ(gathers, w.gathers);
      EXPECT_EQ(reductions, w.reductions);
      comm::current_world()->collective_log().enable(false);
    };
    hp::testing::train_llama(spec);
  }
}

// bfloat16 compute, float32 reduction and master weights: every block computes on
// bfloat16 inputs and parameters (a forward hook), the gathers move bfloat16 and the
// reduce-scatters float32 (the collective log from the first block's forward to the end of
// backward), float32 gradients land on the float32 shards, and the run stays close to
// float32 training.
TEST(FullyShard, MixedPrecision) {
  FullyShardOptions o;
  o.mp_policy = {at::kBFloat16, at::kFloat};
  LlamaRunSpec spec = fsdp_spec({2}, {"dp"}, o);
  auto shard = spec.parallelize;
  spec.parallelize = [shard](nn::Llama& model, const DeviceMesh& mesh) {
    auto set_sync = shard(model, mesh);
    for (auto& [name, m] : model.named_modules())
      if (name.rfind("layers.", 0) == 0 && name.find('.', 7) == std::string::npos)
        m->register_forward_pre_hook([name = name](nn::Module& block, const DTensor& x) {
          EXPECT_EQ(x.scalar_type(), at::kBFloat16) << name << "'s input";
          for (auto& [pname, p] : block.named_parameters())
            EXPECT_EQ(p->scalar_type(), at::kBFloat16) << name << "." << pname << " while gathered";
          // From here to the end of backward only fully_shard communicates (the run's own
          // gathers of gradients and parameters for the comparison come after).
          if (name == "layers.0") comm::current_world()->collective_log().clear();
          return x;
        });
    comm::current_world()->collective_log().enable();
    return set_sync;
  };
  spec.after_backward = [](nn::Llama& model, int64_t) {
    for (auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(p->scalar_type(), at::kFloat) << name;
      EXPECT_EQ(p->grad()->scalar_type(), at::kFloat) << name;
    }
    auto& log = comm::current_world()->collective_log();
    int gathers = 0, reductions = 0;
    for (const auto& r : log.records()) {
      if (r.op == "all_gather" && r.numel > 16) {
        EXPECT_EQ(r.dtype, at::kBFloat16) << r.to_string();
        ++gathers;
      }
      if (r.op == "reduce_scatter") {
        EXPECT_EQ(r.dtype, at::kFloat) << r.to_string();
        ++reductions;
      }
    }
    EXPECT_GT(gathers, 0);
    EXPECT_GT(reductions, 0);
    log.clear();
  };
  LlamaRun run = hp::testing::train_llama(spec);
  const LlamaRun& ref = reference();
  for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(run.losses[i], ref.losses[i], 3e-2 * ref.losses[i]);
  // Five AdamW steps of 1e-2 move a weight by up to 5e-2; bfloat16 rounding may flip a few
  // update signs, but must stay far from that on average.
  for (auto& [name, p] : ref.final_params) {
    EXPECT_LT((run.final_params.at(name) - p).abs().max().item<double>(), 1e-1) << name;
    EXPECT_LT((run.final_params.at(name) - p).abs().mean().item<double>(), 5e-3) << name;
  }
}

// With N shard ranks a rank holds at most 1/N of the parameters, gradients and AdamW
// states (plus chunk rounding). Over two steps of a 4-block model, the gathered bytes are
// sampled as each block starts its forward and its backward: at most the root and two
// blocks (the one computing and the one prefetched), so a block left gathered after its
// forward shows by the third; after the forward at most the root and one block; after the
// backward nothing.
TEST(FullyShard, MemoryIsShardedAndGatheredUnitsAreBounded) {
  constexpr int N = 4;
  comm::run_local_ranks(N, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {N}, {"dp"});
    manual_seed(1);
    nn::LlamaConfig c = hp::testing::tiny_llama();
    c.layers = 4;
    nn::Llama model(c, mesh);
    int64_t total = 0, block = 0, root = 0;
    for (auto& [name, p] : model.named_parameters()) {
      const int64_t bytes = p->spec().numel() * 4;
      total += bytes;
      if (name.rfind("layers.0.", 0) == 0) block += bytes;
      if (name.rfind("layers.", 0) != 0) root += bytes;
    }
    FSDPModule fsdp = fully_shard_llama(model, mesh);
    optim::AdamW opt(model.parameters());
    std::vector<std::string> too_much;
    auto sample = [&](const std::string& when, int64_t bound) {
      const int64_t held = fsdp.unsharded_bytes();
      if (held > bound) too_much.push_back(when + ": " + std::to_string(held) + " > " + std::to_string(bound));
    };
    int64_t step = 0;
    for (auto& [name, m] : model.named_modules()) {
      if (name.rfind("layers.", 0) != 0 || name.find('.', 7) != std::string::npos) continue;
      const std::string block_name = name;
      m->register_forward_pre_hook([&, block_name](nn::Module&, const DTensor& x) {  // the block is gathered
        sample("step " + std::to_string(step) + " forward of " + block_name, root + 2 * block);
        return x;
      });
      m->register_forward_hook([&, block_name](nn::Module&, const DTensor&, const DTensor& out) {
        // Runs in backward once the block's output gradient is known, before its backward.
        out.to_local().register_hook([&, block_name](const at::Tensor& g) {
          sample("step " + std::to_string(step) + " backward of " + block_name, root + 2 * block);
          return g;
        });
        return out;
      });
    }
    std::vector<Placement> rows{Shard(0)};
    for (step = 0; step < 2; ++step) {
      at::Tensor tokens = (hp::rand({4, 9}, at::kDouble) * 32).floor().to(at::kLong);
      DTensor loss = model.loss(distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, rows),
                                distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, rows));
      sample("step " + std::to_string(step) + " after forward", root + block);
      loss.to_local().backward();
      EXPECT_EQ(fsdp.unsharded_bytes(), 0) << "step " << step << ": every unit is resharded after backward";
      opt.step();
      opt.zero_grad();
    }
    EXPECT_TRUE(too_much.empty()) << to_string_list(too_much);
    int64_t held = 0;
    for (DTensor* p : model.parameters()) held += p->to_local().numel() * 4;
    for (auto& s : opt.state()) held += s.local->numel() * 4;
    const int64_t unsharded_total = total * 3;  // parameters and two AdamW states
    EXPECT_LE(held, unsharded_total / N + 3 * 4 * N * 16 * c.layers) << "(slack: one chunk rounding per tensor)";
    EXPECT_GT(held, 0);
  });
}

TEST(FullyShard, ErrorsNameTheProblem) {
  comm::run_local_ranks(2, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    DeviceMesh dp = init_device_mesh("cpu", {2}, {"dp"});
    try {
      fully_shard(model, dp);
      ADD_FAILURE() << "a mesh without the parameters' dims must be refused";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("no dim 'dp'"), std::string::npos) << e.what();
    }
    DeviceMesh three = init_device_mesh("cpu", {1, 1, 2}, {"a", "b", "c"});
    EXPECT_THROW(fully_shard(model, three), hp::Error);
  });
}

// Distributed Muon (each matrix orthogonalised once, on its owner) chained with AdamW.
std::unique_ptr<optim::Optimizer> muon_adamw(nn::Llama& model) {
  return std::make_unique<optim::ChainedOptimizer>(
      optim::get_hyper_optimizer(model, optim::MuonOptions{}, hp::testing::adamw_options()));
}

const LlamaRun& muon_reference() {
  LlamaRunSpec spec;
  spec.optimizer = muon_adamw;
  static LlamaRun ref = hp::testing::train_llama(spec);
  return ref;
}

TEST(FullyShard, Fsdp4Muon) {
  LlamaRunSpec spec = fsdp_spec({4}, {"dp"});
  spec.optimizer = muon_adamw;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), muon_reference());
}
TEST(FullyShard, HsdpMuon) {
  LlamaRunSpec spec = fsdp_spec({2, 2}, {"dp_rep", "dp_shard"});
  spec.optimizer = muon_adamw;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), muon_reference());
}
TEST(FullyShard, FsdpTimesTensorParallelMuon) {
  LlamaRunSpec spec = fsdp_spec({2, 2}, {"dp", "tp"});
  spec.optimizer = muon_adamw;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), muon_reference());
}

// Every matrix orthogonalised by all ranks together, each on a block of its long side
// (MuonSplit::All): the same numbers as the single-process Muon, on 4 ranks, on 3 (the
// blocks and the shards both uneven, 8-row matrices leave one block narrow) and with TP.
std::unique_ptr<optim::Optimizer> split_muon_adamw(nn::Llama& model) {
  optim::MuonOptions muon;
  muon.lr = 0.02, muon.split = optim::MuonSplit::All;
  return std::make_unique<optim::ChainedOptimizer>(
      optim::get_hyper_optimizer(model, muon, hp::testing::adamw_options()));
}
TEST(FullyShard, MuonWithSplitMatrices) {
  for (auto [shape, names] : {std::pair<std::vector<int64_t>, std::vector<std::string>>{{4}, {"dp"}},
                              {{3}, {"dp"}},
                              {{2, 2}, {"dp", "tp"}}}) {
    SCOPED_TRACE(to_string_list(names));
    LlamaRunSpec spec = fsdp_spec(shape, names);
    spec.optimizer = split_muon_adamw;
    if (shape[0] == 3) {
      spec.batch = 3;
      LlamaRunSpec ref;
      ref.batch = 3, ref.optimizer = muon_adamw;
      hp::testing::expect_runs_match(hp::testing::train_llama(spec), hp::testing::train_llama(ref));
    } else {
      hp::testing::expect_runs_match(hp::testing::train_llama(spec), muon_reference());
    }
  }
}

// The seed's recipe: explicit placements with shard_module on the (dp, tp) mesh, then
// fully_shard over dp.
TEST(FullyShard, ComposesWithShardModule) {
  LlamaRunSpec spec;
  spec.mesh_shape = {2, 2}, spec.mesh_names = {"dp", "tp"};
  spec.parallelize = [](nn::Llama& model, const DeviceMesh& mesh) {
    const std::vector<Placement> col{Replicate(), Shard(0)}, row{Replicate(), Shard(1)};
    ShardingPlan plan;
    plan.plan = {{"layers.*.mlp.gate_proj.weight", col},
                 {"layers.*.mlp.up_proj.weight", col},
                 {"layers.*.mlp.down_proj.weight", row}};
    shard_module(model, mesh, plan);
    fully_shard_llama(model, mesh["dp"]);
    return std::function<void(bool)>();
  };
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), reference());
}
