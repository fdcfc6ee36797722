// `hp train`'s [memory] keys (activation checkpointing, optimizer offload to files) against
// the same configuration without them, ranks as threads: the loss of every step, bitwise
// (recompute and offload change no arithmetic), on every rank. Layouts: pp = 2 (1F1B),
// tp = 2 (sequence parallel), dp = 2 with fully_shard.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>

#include "hp/comm/local_ranks.h"
#include "hp/train/trainer.h"
#include "train/trainer_runs.h"

using namespace hp;

namespace {

train::TrainConfig config(const std::string& dim, const std::string& dp) {
  train::TrainConfig c;
  c.mesh.shape = {2};
  c.mesh.names = {dim};
  c.mesh.data_parallel = dp;
  c.mesh.sequence_parallel = dim == "tp";
  c.model.dim = 32, c.model.layers = 4, c.model.heads = 4, c.model.kv_heads = 2, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = 5, c.train.batch = 8, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.deterministic = true;
  return c;
}

std::vector<double> losses(const train::TrainConfig& c) { return hp::testing::run_on_all_ranks(c).losses; }

void expect_same(const std::string& dim, const std::string& dp, const std::string& mode, double budget = 0,
                 bool offload = false) {
  const train::TrainConfig plain = config(dim, dp);
  train::TrainConfig c = plain;
  c.memory.activation_checkpoint = mode;
  c.memory.memory_budget = budget;
  std::string dir;
  if (offload) {
    char tmpl[] = "/tmp/hp_train_offload_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    c.memory.optimizer_offload_dir = dir;
    c.memory.optimizer_offload_batch_mib = 1;
  }
  const std::vector<double> want = losses(plain);
  EXPECT_EQ(losses(c), want) << dim << "=2 " << dp << " " << mode << " budget " << budget << " offload " << offload;
  EXPECT_LT(want.back(), want.front());
  if (!dir.empty()) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(MemoryTraining, Pp2FullCheckpointing) { expect_same("pp", "ddp", "full"); }
TEST(MemoryTraining, Pp2Selective) { expect_same("pp", "ddp", "selective"); }
TEST(MemoryTraining, Tp2SelectiveBudget) { expect_same("tp", "ddp", "selective", 0.5); }
TEST(MemoryTraining, FsdpFullCheckpointingAndOptimizerOffload) { expect_same("dp", "fsdp", "full", 0, true); }
