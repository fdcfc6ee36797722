// `hp train` in bfloat16 ([train] mixed_precision_param = "bfloat16", fully_shard's
// MixedPrecisionPolicy) against the float32 run of the same layout (ranks as threads): the
// blocks' gathered parameters are bfloat16 while they compute, the parameters between steps
// (master weights, which AdamW updates) stay float32, a step's parameter all-gathers move
// exactly half the bytes of float32's, and the losses stay close to float32's.
//
// Tolerance: relative 2e-2 on every loss of 8 steps. bfloat16 keeps 8 significant bits
// (rounding error up to 2^-9 = 0.2% per value); over a block's matmuls, norms and the
// softmax the logits move by about 1%, the loss by less; the difference grows slowly from
// step to step as the float32 masters follow slightly different gradients. A missing cast
// (float32 compute) fails the dtype and byte checks, not this one.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <mutex>

#include "hp/comm/collectives.h"
#include "hp/comm/local_ranks.h"
#include "hp/comm/world.h"
#include "hp/nn/module.h"
#include "hp/train/train_step.h"
#include "hp/train/trainer.h"

using namespace hp;

namespace {

constexpr int64_t kSteps = 8, kLoggedStep = 3;

struct Layout {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::string data_parallel;
};

train::TrainConfig config(const Layout& l, bool bf16) {
  train::TrainConfig c;
  c.mesh.shape = l.shape, c.mesh.names = l.names, c.mesh.data_parallel = l.data_parallel;
  c.model.dim = 32, c.model.layers = 2, c.model.heads = 4, c.model.kv_heads = 2, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = kSteps, c.train.batch = 12, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.deterministic = true;
  if (bf16) c.train.mixed_precision_param = "bfloat16";
  return c;
}

struct TrainRun {  // per rank
  std::vector<double> losses;
  std::vector<int64_t> gather_bytes;  // parameter all-gathers in step kLoggedStep
  std::vector<int> bf16_blocks;       // block forwards that saw only bfloat16 parameters
  std::vector<int> float32_masters;   // steps that began with every parameter float32
};

TrainRun train_run(const train::TrainConfig& c) {
  TrainRun out;
  out.gather_bytes.assign(c.world_size(), 0);
  out.bf16_blocks.assign(c.world_size(), 0);
  out.float32_masters.assign(c.world_size(), 0);
  std::mutex mu;
  std::vector<std::vector<double>> losses(c.world_size());
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) {
    train::TrainHooks hooks;
    hooks.on_built = [&, rank](train::Training& t) {
      for (auto& [name, m] : t.model->named_modules())
        if (name.rfind("layers.", 0) == 0 && name.find('.', 7) == std::string::npos)
          // After fully_shard's own pre-hook: the parameters are the gathered ones.
          m->register_forward_pre_hook([&, rank](nn::Module& block, const DTensor& x) {
            bool bf16 = x.scalar_type() == at::kBFloat16;
            for (auto& [pname, p] : block.named_parameters()) bf16 = bf16 && p->scalar_type() == at::kBFloat16;
            std::lock_guard<std::mutex> lock(mu);
            out.bf16_blocks[rank] += bf16;
            return x;
          });
    };
    hooks.before_step = [&, rank](train::Training& t, int64_t step) {
      auto& log = comm::current_world()->collective_log();
      bool masters = true;
      for (DTensor* p : t.params) masters = masters && p->scalar_type() == at::kFloat;
      if (step == kLoggedStep) log.clear(), log.enable();
      if (step == kLoggedStep + 1) {
        log.enable(false);
        int64_t bytes = 0;
        for (const auto& r : log.records())
          if (r.op == "all_gather" && r.numel > 16) bytes += r.bytes();  // not the loss's or the norm's
        out.gather_bytes[rank] = bytes;
      }
      std::lock_guard<std::mutex> lock(mu);
      out.float32_masters[rank] += masters;
    };
    losses[rank] = train::run_training(c, hooks).losses;
  });
  for (size_t r = 1; r < losses.size(); ++r) EXPECT_EQ(losses[r], losses[0]) << "rank " << r;
  out.losses = losses[0];
  return out;
}

class MixedPrecision : public ::testing::TestWithParam<Layout> {};

TEST_P(MixedPrecision, GathersBfloat16KeepsFloat32MastersAndTracksFloat32Loss) {
  const Layout& l = GetParam();
  const TrainRun ref = train_run(config(l, false)), half = train_run(config(l, true));
  ASSERT_EQ(half.losses.size(), ref.losses.size());
  for (size_t k = 0; k < ref.losses.size(); ++k)
    EXPECT_NEAR(half.losses[k], ref.losses[k], 2e-2 * ref.losses[k]) << "step " << k;
  EXPECT_NE(half.losses, ref.losses) << "the bfloat16 run computed in float32";
  for (size_t r = 0; r < half.bf16_blocks.size(); ++r) {
    EXPECT_EQ(half.bf16_blocks[r], kSteps * 2) << "rank " << r << ": every forward of both blocks on bfloat16 "
                                               << "parameters and inputs";
    EXPECT_EQ(ref.bf16_blocks[r], 0) << "rank " << r;
    EXPECT_EQ(half.float32_masters[r], kSteps) << "rank " << r;
    if (l.shape[0] > 1) {  // dp first: fully_shard gathers
      ASSERT_GT(ref.gather_bytes[r], 0) << "rank " << r;
      EXPECT_EQ(2 * half.gather_bytes[r], ref.gather_bytes[r]) << "rank " << r;
    }
  }
}

// Muon's Newton-Schulz iteration in bfloat16 (train.muon_ns_dtype) on 1, 3 and 2 x 2 ranks:
// every loss of 8 steps within relative 1e-3 of float32 Muon's on the same layout and of
// the bfloat16 run on one rank (both about 5e-5 here; the updates move by about 1%, the
// loss by far less), and not equal to float32's (the key took effect).
TEST(MixedPrecisionMuon, NewtonSchulzInBfloat16TracksFloat32) {
  std::vector<double> one_rank;
  for (const Layout& l : {Layout{{1}, {"dp"}, "fsdp"}, Layout{{3}, {"dp"}, "fsdp"}, Layout{{2, 2}, {"dp", "tp"}, "zero2"}}) {
    train::TrainConfig c = config(l, false);
    c.train.optimizer = "muon";
    const std::vector<double> f32 = train_run(c).losses;
    c.train.muon_ns_dtype = "bfloat16";
    const std::vector<double> bf16 = train_run(c).losses;
    if (one_rank.empty()) one_rank = bf16;
    std::string where;
    for (size_t i = 0; i < l.shape.size(); ++i) where += l.names[i] + std::to_string(l.shape[i]) + " ";
    where += l.data_parallel;
    ASSERT_EQ(bf16.size(), f32.size());
    EXPECT_NE(bf16, f32) << where << ": the iteration ran in float32";
    for (size_t k = 0; k < f32.size(); ++k) {
      EXPECT_NEAR(bf16[k], f32[k], 1e-3 * f32[k]) << where << ", step " << k;
      EXPECT_NEAR(bf16[k], one_rank[k], 1e-3 * one_rank[k]) << where << ", step " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, MixedPrecision,
                         ::testing::Values(Layout{{2}, {"dp"}, "fsdp"}, Layout{{1}, {"dp"}, "fsdp"},
                                           Layout{{3}, {"dp"}, "zero2"}, Layout{{2, 2}, {"dp", "tp"}, "fsdp"}),
                         [](const auto& info) {
                           std::string s;
                           for (size_t i = 0; i < info.param.shape.size(); ++i)
                             s += info.param.names[i] + std::to_string(info.param.shape[i]) + "_";
                           return s + info.param.data_parallel;
                         });

}  // namespace
