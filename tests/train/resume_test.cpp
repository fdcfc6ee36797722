// Checkpoints in the trainer and deterministic mode (ranks as threads): two runs of one
// configuration agree bitwise; a run resumed from a checkpoint ends with bitwise the same
// parameters and optimizer state as the uninterrupted run, and the same losses after the
// resume point.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "hp/checkpoint.h"
#include "hp/comm/local_ranks.h"
#include "hp/train/trainer.h"
#include "train/trainer_runs.h"

using namespace hp;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& tag) {
  auto dir = fs::path(::testing::TempDir()) / ("hp_resume_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir.string();
}

train::TrainConfig config(std::vector<int64_t> mesh, std::vector<std::string> names, const std::string& dir) {
  train::TrainConfig c;
  c.mesh.shape = std::move(mesh);
  c.mesh.names = std::move(names);
  c.model.dim = 32, c.model.layers = 1, c.model.heads = 4, c.model.kv_heads = 4, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = 6, c.train.batch = 4, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.deterministic = true;
  c.checkpoint.dir = dir, c.checkpoint.every = 3, c.checkpoint.keep = 0;
  return c;
}

// Rank 0's result, after checking that every rank reports the same, bitwise.
train::TrainResult run(const train::TrainConfig& c) {
  std::vector<train::TrainResult> results(c.world_size());
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) { results[rank] = train::run_training(c); });
  for (size_t r = 1; r < results.size(); ++r) {
    EXPECT_EQ(results[r].first_step, results[0].first_step) << "rank " << r;
    EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
  }
  return results[0];
}

// Every tensor of two checkpoints, compared bitwise; returns how many.
size_t expect_same_tensors(const std::string& a, const std::string& b) {
  const auto ma = checkpoint::read_metadata(a), mb = checkpoint::read_metadata(b);
  EXPECT_EQ(ma.scalars, mb.scalars);
  EXPECT_EQ(ma.tensors.size(), mb.tensors.size());
  for (const auto& [name, _] : ma.tensors)
    EXPECT_TRUE(at::equal(checkpoint::read_tensor(a, name), checkpoint::read_tensor(b, name))) << name;
  return ma.tensors.size();
}

}  // namespace

TEST(TrainResume, DeterministicRunsAgreeAndAResumedRunEndsBitwiseEqual) {
  const auto dir_a = fresh_dir("a"), dir_b = fresh_dir("b");
  auto cfg_a = config({2, 2}, {"dp", "tp"}, dir_a), cfg_b = config({2, 2}, {"dp", "tp"}, dir_b);
  auto a = run(cfg_a);
  auto b = run(cfg_b);
  ASSERT_EQ(a.losses.size(), 6u);
  EXPECT_EQ(a.losses, b.losses);  // bitwise
  EXPECT_EQ(checkpoint::list_steps(dir_a), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(expect_same_tensors(checkpoint::step_dir(dir_a, 6), checkpoint::step_dir(dir_b, 6)), 3u * 12);

  // Lose the last checkpoint of b: the next run resumes at step 3 and redoes 3..5.
  fs::remove_all(checkpoint::step_dir(dir_b, 6));
  auto resumed = run(cfg_b);
  EXPECT_EQ(resumed.first_step, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  EXPECT_EQ(resumed.losses, std::vector<double>(a.losses.begin() + 3, a.losses.end()));
  expect_same_tensors(checkpoint::step_dir(dir_a, 6), checkpoint::step_dir(dir_b, 6));

  // A finished run resumes at its end and does nothing; resume = false starts afresh.
  EXPECT_TRUE(run(cfg_b).losses.empty());
  cfg_b.checkpoint.resume = false;
  EXPECT_EQ(run(cfg_b).losses, a.losses);
}

TEST(TrainResume, ACheckpointFromDp2xTp2ResumesAtTp4) {
  // The same run on another layout: the tensors are resharded as they load, and the loss
  // after the resume agrees to float32 rounding (reductions run in another order).
  const auto dir = fresh_dir("relayout"), ref_dir = fresh_dir("relayout_ref");
  auto ref = run(config({2, 2}, {"dp", "tp"}, ref_dir));
  auto cfg = config({2, 2}, {"dp", "tp"}, dir);
  run(cfg);
  fs::remove_all(checkpoint::step_dir(dir, 6));
  auto tp4 = config({4}, {"tp"}, dir);
  auto resumed = run(tp4);
  EXPECT_EQ(resumed.first_step, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(resumed.losses[k], ref.losses[3 + k], 1e-5 * ref.losses[3 + k]) << k;
  // Parameters after the last step: the same rounding (1.2e-5 at most between these layouts).
  hp::testing::expect_close_params(checkpoint::step_dir(ref_dir, 6), checkpoint::step_dir(dir, 6), 1e-4, 1e-4,
                                   "dp2 x tp2 resumed at tp4");
}

TEST(TrainResume, Dp4AndDp2xTp2AgreeToRoundingNotBitwise) {
  // Same data, same initial values; tensor parallelism sums the matmuls' partial products
  // in another order, so the runs agree to float32 rounding only. The figures printed here
  // are the ones docs/design-notes.md quotes.
  const auto dir_dp = fresh_dir("dp4"), dir_tp = fresh_dir("dp2tp2");
  auto dp = run(config({4}, {"dp"}, dir_dp));
  auto tp = run(config({2, 2}, {"dp", "tp"}, dir_tp));
  ASSERT_EQ(dp.losses.size(), tp.losses.size());
  double max_loss = 0, max_param = 0;
  for (size_t k = 0; k < dp.losses.size(); ++k) max_loss = std::max(max_loss, std::abs(dp.losses[k] - tp.losses[k]));
  const auto a = checkpoint::step_dir(dir_dp, 6), b = checkpoint::step_dir(dir_tp, 6);
  for (const auto& [name, _] : checkpoint::read_metadata(a).tensors) {
    if (name.rfind("model.", 0) != 0) continue;
    at::Tensor x = checkpoint::read_tensor(a, name), y = checkpoint::read_tensor(b, name);
    max_param = std::max(max_param, (x - y).abs().max().item<double>());
  }
  std::printf("dp=4 vs dp=2 x tp=2 over 6 steps: max |loss diff| %.3g, max |param diff| %.3g\n", max_loss, max_param);
  EXPECT_LT(max_loss, 1e-5);
  EXPECT_LT(max_param, 1e-4);
  EXPECT_GT(max_param, 0) << "the layouts agreed bitwise: the comment above (and the design notes) no longer hold";
}
