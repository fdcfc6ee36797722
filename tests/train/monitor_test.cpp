// The precision monitor in the trainer (ranks as threads), each failure injected on purpose:
// a NaN written into one module's output on one rank is reported at that module, step and
// rank, and a NaN gradient likewise; a byte flipped in one dp rank's copy of a parameter is
// caught at the next replica check, naming that rank; the per-module norms of a dp = 2 run
// equal the single-process run's to rtol 1e-5 (and those of dp = 2 x tp = 2 to rtol 1e-4:
// tensor parallelism sums partial products in another order); a loss spike is logged;
// with the monitor off nothing is written. Pipeline stages: the norms equal the pp = 1
// run's, and a NaN in one stage stops them all.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "hp/base/error.h"
#include "hp/comm/local_ranks.h"
#include "hp/train/monitor_log.h"
#include "hp/train/replica_check.h"
#include "hp/train/train_step.h"
#include "hp/train/trainer.h"

using namespace hp;
namespace fs = std::filesystem;

namespace {

std::string temp(const std::string& name) {
  return (fs::path(::testing::TempDir()) / ("hp_monitor_" + std::to_string(::getpid()) + "_" + name)).string();
}

train::TrainConfig config(std::vector<int64_t> mesh, std::vector<std::string> names) {
  train::TrainConfig c;
  c.mesh.shape = std::move(mesh);
  c.mesh.names = std::move(names);
  c.model.dim = 32, c.model.layers = 2, c.model.heads = 4, c.model.kv_heads = 4, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = 6, c.train.batch = 4, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.peak_tflops = 1;  // no measurement
  return c;
}

// Runs every rank; the error every rank stopped with ("" when none did).
std::string run(const train::TrainConfig& c, const train::TrainHooks& hooks = {}) {
  try {
    comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int) { train::run_training(c, hooks); });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A forward hook on `module` of rank `rank` that replaces its output (or, with `gradient`,
// the gradient flowing into it) by NaN at step `step`.
train::TrainHooks inject_nan(const std::string& module, int rank, int64_t step, bool gradient,
                             std::vector<int64_t>& step_of_rank) {
  train::TrainHooks h;
  h.before_step = [&step_of_rank](train::Training& t, int64_t s) { step_of_rank[t.mesh.rank()] = s; };
  h.on_built = [=, &step_of_rank](train::Training& t) {
    for (auto& [name, m] : t.model->named_modules()) {
      if (name != module) continue;
      m->register_forward_hook([=, &step_of_rank, &t](nn::Module&, const DTensor&, const DTensor& out) {
        if (t.mesh.rank() != rank || step_of_rank[rank] != step) return out;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        if (gradient) {
          out.to_local().register_hook([nan](const at::Tensor& g) { return g * nan; });
          return out;
        }
        return DTensor(out.to_local() * nan, out.device_mesh(), out.spec());
      });
    }
  };
  return h;
}

// Before step `step` on rank `rank`, one mantissa bit of the first element of `param`
// flips: still finite, and too large to be rounded away.
train::TrainHooks flip_a_bit(int rank, int64_t step, const std::string& param = "layers.0.attn.q_proj.weight") {
  train::TrainHooks h;
  h.before_step = [=](train::Training& t, int64_t s) {
    if (s != step || t.mesh.rank() != rank) return;
    for (auto& [name, p] : t.model->named_parameters())
      if (name == param) static_cast<uint8_t*>(p->to_local().data_ptr())[2] ^= 0x10;
  };
  return h;
}

}  // namespace

TEST(Monitor, ANanOutputStopsTrainingAtItsModuleStepAndRank) {
  auto c = config({2, 2}, {"dp", "tp"});
  c.monitor.every = 1;
  std::vector<int64_t> step_of_rank(4, -1);
  const std::string e = run(c, inject_nan("layers.1.mlp.down_proj", 2, 3, /*gradient=*/false, step_of_rank));
  EXPECT_NE(e.find("non-finite activation in layers.1.mlp.down_proj at step 3 on rank 2"), std::string::npos) << e;
}

TEST(Monitor, ANanGradientStopsTrainingAtItsModuleStepAndRank) {
  auto c = config({2, 2}, {"dp", "tp"});
  c.monitor.every = 2;
  std::vector<int64_t> step_of_rank(4, -1);
  const std::string e = run(c, inject_nan("layers.0.attn.o_proj", 1, 4, /*gradient=*/true, step_of_rank));
  EXPECT_NE(e.find("non-finite output gradient in layers.0.attn.o_proj at step 4 on rank 1"), std::string::npos) << e;
}

TEST(Monitor, AFlippedByteInOneReplicaIsCaughtNamingItsRank) {
  auto c = config({4}, {"dp"});
  c.monitor.replica_check_every = 2;
  std::string e = run(c, flip_a_bit(/*rank=*/2, /*step=*/3));
  EXPECT_NE(e.find("replica mismatch in layers.0.attn.q_proj.weight at step 3: rank 2 differs from the other "
                   "copies on ranks [0, 1, 2, 3] (replicated over dp)"),
            std::string::npos)
      << e;

  // dp = 2 x tp = 2: the norm's weight is replicated over both dims, so four copies vote.
  c = config({2, 2}, {"dp", "tp"});
  c.monitor.replica_check_every = 2;
  e = run(c, flip_a_bit(/*rank=*/3, /*step=*/3, "layers.1.mlp_norm.weight"));
  EXPECT_NE(e.find("replica mismatch in layers.1.mlp_norm.weight at step 3: rank 3 differs from the other copies on "
                   "ranks [0, 1, 2, 3] (replicated over dp, tp)"),
            std::string::npos)
      << e;

  // Two replicas: no majority to say which one is wrong.
  c = config({2}, {"dp"});
  c.monitor.replica_check_every = 2;
  e = run(c, flip_a_bit(/*rank=*/1, /*step=*/3));
  EXPECT_NE(e.find("at step 3: ranks 0, 1 hold different copies (replicated over dp) and none has a majority"),
            std::string::npos)
      << e;

  // Under fully_shard each dp rank holds its own shard: no copy to compare, nothing found.
  c.mesh.data_parallel = "fsdp";
  EXPECT_EQ(run(c, flip_a_bit(/*rank=*/1, /*step=*/3)), "");
}

TEST(Monitor, ReplicasAreCheckedInsidePipelineStages) {
  auto c = config({2, 2}, {"pp", "dp"});
  c.train.batch = 8;  // 4 microbatches over 2 dp ranks
  c.monitor.replica_check_every = 1;
  EXPECT_EQ(run(c), "");
  // A flip on stage 1 (ranks 2 and 3) stops stage 0 too; the lowest rank's error is rank 0's.
  std::vector<std::string> errors(4);
  train::TrainHooks flip = flip_a_bit(/*rank=*/3, /*step=*/2, "layers.1.mlp.up_proj.weight");
  try {
    comm::run_local_ranks(4, [&](int rank) {
      try {
        train::run_training(c, flip);
      } catch (const Error& e) {
        errors[rank] = e.what();
        throw;
      }
    });
  } catch (const Error&) {
  }
  EXPECT_NE(errors[0].find("replica mismatch at step 2 on another pipeline stage (rank 2 found it)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[3].find("replica mismatch in layers.1.mlp.up_proj.weight at step 2: ranks 2, 3 hold different "
                           "copies (replicated over dp)"),
            std::string::npos)
      << errors[3];
}

namespace {

// Every line of the log in `file` holds the norms of `want`'s, to `rtol`.
void expect_same_norms(const std::vector<train::MonitorRecord>& want, const std::string& file, double rtol) {
  const auto vs = train::compare_monitor_logs(want, train::read_monitor_log(file), rtol);
  EXPECT_EQ(vs.lines_compared, static_cast<int64_t>(want.size())) << file;
  EXPECT_FALSE(vs.first) << file << ": step " << vs.first->step << " " << vs.first->module << " " << vs.first->metric
                         << ": " << vs.first->a << " vs " << vs.first->b;
}

}  // namespace

TEST(Monitor, NormsOfDataAndTensorParallelRunsEqualTheSingleProcessRun) {
  const std::string single = temp("single.jsonl"), dp2 = temp("dp2.jsonl"), dp2tp2 = temp("dp2tp2.jsonl");
  auto c = config({1}, {"dp"});
  c.train.steps = 4;
  c.monitor.every = 1;
  c.monitor.file = single;
  ASSERT_EQ(run(c), "");
  c.mesh.shape = {2};
  c.monitor.file = dp2;
  c.monitor.replica_check_every = 1;  // and no false alarm
  ASSERT_EQ(run(c), "");
  c.mesh.shape = {2, 2}, c.mesh.names = {"dp", "tp"};
  c.monitor.file = dp2tp2;
  ASSERT_EQ(run(c), "");

  const auto a = train::read_monitor_log(single);
  // 2 layers of 9 modules with parameters, the embedding, the final norm and the head: 21.
  const int64_t modules = 2 * 9 + 3;
  ASSERT_EQ(a.size(), static_cast<size_t>(4 * (modules + 1)));
  EXPECT_EQ(a[0].module, "tok_embeddings");
  EXPECT_EQ(a[modules - 1].module, "output");
  for (const auto& r : a) {
    EXPECT_GT(r.grad_norm, 0) << r.step << " " << r.module;
    if (r.is_module()) EXPECT_GT(r.act_norm, 0) << r.step << " " << r.module;
  }
  expect_same_norms(a, dp2, 1e-5);
  expect_same_norms(a, dp2tp2, 1e-4);
  for (const auto& f : {single, dp2, dp2tp2}) fs::remove(f);
}

// Activation checkpointing runs forwards again, and a region inside a block's recompute
// stands in for its output with garbage: the norms are still those of the run without
// (the activations recorded once, in the forward; rtol 1e-5: token chunks sum the weight
// gradients in another order).
TEST(Monitor, NormsUnderActivationCheckpointingEqualTheRunWithout) {
  const std::string plain = temp("plain.jsonl"), full = temp("full.jsonl"), chunked = temp("chunked.jsonl");
  auto c = config({1}, {"dp"});
  c.train.steps = 3;
  c.monitor.every = 1;
  c.monitor.file = plain;
  ASSERT_EQ(run(c), "");
  c.memory.activation_checkpoint = "full";
  c.monitor.file = full;
  ASSERT_EQ(run(c), "");
  c.memory.chunked_modules = {"layers.*.mlp"};
  c.monitor.file = chunked;
  ASSERT_EQ(run(c), "");
  const auto a = train::read_monitor_log(plain);
  for (const auto& f : {full, chunked}) expect_same_norms(a, f, 1e-5);
  for (const auto& f : {plain, full, chunked}) fs::remove(f);
}

// Pipeline stages: each rank records the modules of its chunks, and the log holds every
// module of the whole model, in its forward order, with the pp = 1 run's norms (rtol 1e-5:
// the microbatches' sums of squares add up in another order). 1F1B at pp = 2, with dp = 2
// inside the stages, and interleaved 1F1B (two chunks per rank, so a rank's chunks are not
// consecutive) on an uneven split of 2 + 1 + 1 + 0 blocks.
TEST(Monitor, NormsOfPipelineStagesEqualThePp1Run) {
  auto c = config({1}, {"dp"});
  c.model.layers = 4;
  c.train.steps = 3, c.train.batch = 8;
  c.monitor.every = 1;
  c.monitor.file = temp("pp1.jsonl");
  ASSERT_EQ(run(c), "");
  const auto want = train::read_monitor_log(c.monitor.file);
  struct Layout {
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    std::string schedule;
    std::vector<int64_t> split;
  };
  for (const Layout& l : {Layout{{2}, {"pp"}, "1f1b", {}}, Layout{{2, 2}, {"pp", "dp"}, "1f1b", {}},
                          Layout{{2}, {"pp"}, "interleaved-1f1b", {2, 1, 1, 0}}}) {
    SCOPED_TRACE(l.schedule + " on " + std::to_string(l.shape.size()) + " dims");
    auto p = c;
    p.mesh.shape = l.shape, p.mesh.names = l.names;
    p.pipeline.schedule = l.schedule, p.pipeline.split = l.split;
    p.monitor.file = temp("pp.jsonl");
    ASSERT_EQ(run(p), "");
    const auto got = train::read_monitor_log(p.monitor.file);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].module, want[i].module) << "line " << i;
    const auto diff = train::compare_monitor_logs(want, got, 1e-5);
    EXPECT_EQ(diff.lines_compared, static_cast<int64_t>(want.size()));
    EXPECT_FALSE(diff.first) << "step " << diff.first->step << " " << diff.first->module << " "
                             << diff.first->metric << ": " << diff.first->a << " vs " << diff.first->b;
    fs::remove(p.monitor.file);
  }
  fs::remove(c.monitor.file);
}

// A NaN in the second stage stops every rank of both stages, naming its module and rank.
TEST(Monitor, ANanInOneStageStopsEveryStage) {
  auto c = config({2}, {"pp"});
  c.train.batch = 8;
  c.monitor.every = 1;
  std::vector<int64_t> step_of_rank(2, -1);
  for (bool gradient : {false, true}) {
    const std::string e = run(c, inject_nan("layers.1.attn.o_proj", 1, 2, gradient, step_of_rank));
    const std::string what = gradient ? "output gradient" : "activation";
    EXPECT_NE(e.find("non-finite " + what + " in layers.1.attn.o_proj at step 2 on rank 1"), std::string::npos) << e;
  }
}

TEST(Monitor, ALossSpikeIsLogged) {
  const std::string path = temp("spike.jsonl");
  auto c = config({2}, {"dp"});
  c.train.steps = 12;
  c.monitor.spike_factor = 3;
  c.monitor.file = path;
  train::TrainHooks blow_up;  // the head's weight times 30 on every rank: logits, loss and gradients jump
  blow_up.before_step = [](train::Training& t, int64_t step) {
    if (step != 10) return;
    at::NoGradGuard no_grad;
    for (auto& [name, p] : t.model->named_parameters())
      if (name == "output.weight") p->to_local().mul_(30);
  };
  ASSERT_EQ(run(c, blow_up), "");
  const auto log = train::read_monitor_log(path);
  bool loss_spike = false;
  for (const auto& r : log) {
    EXPECT_TRUE(r.is_event());  // only spikes: the norms are off
    EXPECT_GE(r.step, 10);      // and the jump lasts
    if (r.step == 10 && r.event == "loss_spike") loss_spike = r.value > 3 * r.median;
  }
  EXPECT_TRUE(loss_spike);
  fs::remove(path);
}

TEST(Monitor, OffWritesNothing) {
  const std::string path = temp("off.jsonl");
  auto c = config({2}, {"dp"});
  c.monitor.file = path;  // every part at 0
  ASSERT_EQ(run(c), "");
  EXPECT_FALSE(fs::exists(path));
}

TEST(Monitor, MinorityRanks) {
  EXPECT_EQ(train::minority_ranks({7, 7, 7}), std::vector<int>{});
  EXPECT_EQ(train::minority_ranks({7, 7, 9, 7}), std::vector<int>{2});
  EXPECT_EQ(train::minority_ranks({7, 9}), (std::vector<int>{0, 1}));
  EXPECT_EQ(train::minority_ranks({7, 7, 9, 9}), (std::vector<int>{0, 1, 2, 3}));
}
