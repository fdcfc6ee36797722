// The real dry-run (fake process groups, meta tensors) against real runs of the same
// configuration on thread ranks over Gloo: the same collectives call for call, and a
// memory high-water mark close to the CPU run's peak tensor bytes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "hp/comm/local_ranks.h"
#include "hp/tensor/memory_stats.h"
#include "hp/train/dry_run.h"
#include "hp/train/train_step.h"

using namespace hp;

namespace {

train::TrainConfig config(std::vector<int64_t> shape, std::vector<std::string> names, const std::string& dp) {
  train::TrainConfig c;
  c.mesh.shape = std::move(shape);
  c.mesh.names = std::move(names);
  c.mesh.data_parallel = dp;
  c.mesh.sequence_parallel = c.mesh_size("tp") > 1;
  c.model.dim = 32, c.model.layers = 2, c.model.heads = 4, c.model.kv_heads = 2, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = 2, c.train.batch = 4, c.train.seq = 16;
  return c;
}

// One real step on this rank's rows of random tokens.
void real_steps(train::Training& t, const train::TrainConfig& c, int64_t steps) {
  const int64_t rows = c.train.batch / t.data_size;
  for (int64_t s = 0; s < steps; ++s) {
    at::Tensor ids = at::randint(0, c.model.vocab, {rows, c.train.seq}, at::kLong);
    at::Tensor targets = at::randint(0, c.model.vocab, {rows, c.train.seq}, at::kLong);
    train::train_step(t, c, ids, targets, c.train.lr);
  }
}

// Every rank's collective log of a real run (Gloo and shared memory, ranks as threads).
std::map<int, std::vector<comm::CollectiveRecord>> real_logs(const train::TrainConfig& c, int64_t steps) {
  std::map<int, std::vector<comm::CollectiveRecord>> logs;
  std::mutex mu;
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) {
    auto world = comm::current_world();
    world->collective_log().enable();
    train::Training t = train::build_training(c);
    real_steps(t, c, steps);
    std::lock_guard<std::mutex> lock(mu);
    logs[rank] = world->collective_log().records();
  });
  return logs;
}

void expect_same_log(const std::vector<comm::CollectiveRecord>& real, const std::vector<comm::CollectiveRecord>& dry,
                     int rank) {
  ASSERT_EQ(real.size(), dry.size()) << "rank " << rank;
  for (size_t i = 0; i < real.size(); ++i)
    ASSERT_EQ(real[i], dry[i]) << "rank " << rank << ", collective " << i << ": real " << real[i].to_string()
                               << ", dry-run " << dry[i].to_string();
}

void expect_dry_run_matches_real(const train::TrainConfig& c) {
  const int64_t steps = 2;
  auto real = real_logs(c, steps);
  for (int rank = 0; rank < c.world_size(); ++rank) {
    train::DryRunResult dry = train::dry_run(c, rank, steps);
    EXPECT_GT(dry.collectives.size(), 0u);
    expect_same_log(real.at(rank), dry.collectives, rank);
  }
}

}  // namespace

TEST(DryRun, Fp8AmaxReductionsMatchGlooCallForCallDp2xTp2) {
  const train::TrainConfig plain = config({2, 2}, {"dp", "tp"}, "fsdp");
  const size_t without = train::dry_run(plain, 0, 1).collectives.size();
  for (const char* scaling : {"tensorwise", "rowwise", "mx_block"}) {
    SCOPED_TRACE(scaling);
    train::TrainConfig c = plain;
    c.low_precision.scaling = scaling;
    expect_dry_run_matches_real(c);
    EXPECT_GT(train::dry_run(c, 0, 1).collectives.size(), without);  // the amax all-reduces
  }
}

// [low_precision] fsdp_float8_all_gather: the blocks gather bytes (E4M3 weights, float32
// norms) after one max all-reduce of their amaxes per forward gather.
TEST(DryRun, Fp8AllGatherMatchesGlooCallForCallDp2xTp2) {
  train::TrainConfig c = config({2, 2}, {"dp", "tp"}, "fsdp");
  c.low_precision.scaling = "tensorwise";
  c.low_precision.fsdp_float8_all_gather = true;
  expect_dry_run_matches_real(c);
  int byte_gathers = 0;
  for (const auto& r : train::dry_run(c, 0, 1).collectives) byte_gathers += r.op == "all_gather" && r.dtype == at::kByte;
  EXPECT_GT(byte_gathers, 0);
}

TEST(DryRun, CollectivesMatchGlooCallForCallDp2xTp2) {
  expect_dry_run_matches_real(config({2, 2}, {"dp", "tp"}, "ddp"));
}

TEST(DryRun, CollectivesMatchGlooCallForCallFsdp4) { expect_dry_run_matches_real(config({4}, {"dp"}, "fsdp")); }

// Pipeline stages: every rank of a pp = 2 x dp = 2 x tp = 2 job, stages inside the meshes.
TEST(DryRun, CollectivesMatchGlooCallForCallPp2xDp2xTp2) {
  train::TrainConfig c = config({2, 2, 2}, {"pp", "dp", "tp"}, "ddp");
  c.train.batch = 8;
  expect_dry_run_matches_real(c);
}

// A split backward (zero bubble) runs the FP8 linear's node twice, for dX then for dW.
TEST(DryRun, Fp8CollectivesMatchGlooCallForCallPp2xDp2xTp2ZeroBubble) {
  train::TrainConfig c = config({2, 2, 2}, {"pp", "dp", "tp"}, "ddp");
  c.train.batch = 8;
  c.pipeline.schedule = "zb-h1";
  c.low_precision.scaling = "rowwise";
  expect_dry_run_matches_real(c);
}

namespace {

// The meta high-water mark over the CPU run's peak tensor bytes, one rank and the same
// steps. CPU kernels may allocate a few temporaries that meta kernels do not (5%).
double dry_run_over_cpu_peak(const train::TrainConfig& c) {
  track_cpu_memory();
  const int64_t steps = 2;
  int64_t cpu_peak = 0;
  comm::run_local_ranks(1, [&](int) {
    const int64_t before = cpu_memory_allocated();
    {
      train::Training t = train::build_training(c);
      reset_cpu_memory_peak();
      real_steps(t, c, steps);
    }
    cpu_peak = cpu_memory_peak() - before;
  });
  train::DryRunResult dry = train::dry_run(c, 0, steps);
  const double ratio = double(dry.peak_bytes) / double(cpu_peak);
  std::printf("dry-run high-water %.3f MiB, cpu peak %.3f MiB, ratio %.3f\n", dry.peak_bytes / 1048576.0,
              cpu_peak / 1048576.0, ratio);
  return ratio;
}

}  // namespace

TEST(DryRun, HighWaterMarkNearCpuPeak) {
  EXPECT_NEAR(dry_run_over_cpu_peak(config({1}, {"dp"}, "ddp")), 1.0, 0.05);
}

// The same on a MoE model whose activations dominate, uncheckpointed and under each
// checkpointing: the dry-run's meta stand-ins for the MoE's kernels (the grouped products,
// the dispatcher's rows) must allocate what the kernels do.
class MoEHighWaterMark : public ::testing::TestWithParam<std::string> {};

TEST_P(MoEHighWaterMark, NearCpuPeak) {
  train::TrainConfig c = config({1}, {"dp"}, "ddp");
  c.model.layers = 3, c.model.dim = 64, c.model.ffn_dim = 128, c.model.max_seq = 64;
  c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.hidden_dim = 48, c.moe.dense_layers = 1;
  c.moe.aux_loss_coef = 0.01;
  c.train.batch = 16, c.train.seq = 64;
  c.memory.activation_checkpoint = GetParam();
  EXPECT_NEAR(dry_run_over_cpu_peak(c), 1.0, 0.05) << "checkpointing '" << GetParam() << "'";
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, MoEHighWaterMark, ::testing::Values("", "full", "selective"),
                         [](const auto& info) { return info.param.empty() ? std::string("none") : info.param; });

TEST(DryRun, ClearErrors) {
  const train::TrainConfig c = config({2, 2}, {"dp", "tp"}, "ddp");
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { train::dry_run(c, 4); }).find("rank 4 is outside the mesh [2, 2] of 4 ranks"),
            std::string::npos);
  EXPECT_NE(message([&] { train::dry_run(c, -1); }).find("outside"), std::string::npos);
  train::TrainConfig cp = c;
  cp.mesh.names = {"cp", "tp"};
  cp.mesh.sequence_parallel = false;  // cp shards the sequence itself
  EXPECT_NE(message([&] { train::dry_run(cp, 0); }).find("context parallelism"), std::string::npos);
  train::TrainConfig ep = c;
  ep.mesh.names = {"ep", "tp"};
  EXPECT_NE(message([&] { train::dry_run(ep, 0); }).find("needs a MoE model"), std::string::npos);  // dense Llama
  train::TrainConfig odd = config({3}, {"dp"}, "ddp");  // batch 4 over 3 dp ranks
  EXPECT_NE(message([&] { train::dry_run(odd, 0); }).find("divisible"), std::string::npos);
}

// A far corner of a large mesh: the last rank of dp 512 x tp 2, fsdp and ddp.
TEST(DryRun, LastRankOfLargeMesh) {
  for (const char* dp : {"fsdp", "ddp"}) {
    train::TrainConfig c = config({512, 2}, {"dp", "tp"}, dp);
    c.train.batch = 512;
    train::DryRunResult r = train::dry_run(c, 1023, 1);
    EXPECT_GT(r.peak_bytes, 0) << dp;
    EXPECT_GT(r.collectives.size(), 0u) << dp;
    for (const auto& x : r.collectives)
      EXPECT_TRUE(x.ranks.size() == 2 || x.ranks.size() == 512) << x.to_string();
  }
}

// MoE blocks in pipeline stages run on meta tensors too: the last rank of pp 2 x ep 2 (its
// stage holds MoE blocks) exchanges tokens with its ep peer only, and the stages' auxiliary
// losses meet over pp.
TEST(DryRun, MoEInPipelineStages) {
  train::TrainConfig c = config({2, 2}, {"pp", "ep"}, "ddp");
  c.model.layers = 4;
  c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.hidden_dim = 16, c.moe.dense_layers = 1;
  c.moe.aux_loss_coef = 0.01, c.moe.load_balance_bias = true;
  c.pipeline.split = {2, 2}, c.train.batch = 8;  // 4 microbatches over ep 2
  const train::DryRunResult r = train::dry_run(c, 3, 1);
  EXPECT_GT(r.peak_bytes, 0);
  int all_to_all = 0;
  for (const auto& x : r.collectives)
    if (x.op == "all_to_all") {
      ++all_to_all;
      EXPECT_EQ(x.ranks, (std::vector<int>{2, 3})) << x.to_string();
    }
  EXPECT_GT(all_to_all, 0);
}
