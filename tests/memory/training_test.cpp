// `hp train`'s [memory] keys (activation checkpointing, optimizer and fully_shard offload to files) against
// the same configuration without them, ranks as threads: the loss of every step, bitwise
// (recompute and offload change no arithmetic), on every rank. Layouts: pp = 2 (1F1B),
// tp = 2 (sequence parallel), dp = 2 with fully_shard.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>

#include "hp/checkpoint.h"
#include "hp/comm/local_ranks.h"
#include "hp/memory/checkpoint.h"
#include "hp/train/train_step.h"
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

// As losses(c), counting the shard files every rank holds before its second step, and
// listing per optimizer batch the names of the state rank 0 holds in files then.
std::vector<double> offloaded_losses(const train::TrainConfig& c, std::atomic<int>* shard_files,
                                     std::map<std::string, std::set<std::string>>* optimizer_batches = nullptr) {
  std::vector<train::TrainResult> results(c.world_size());
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) {
    train::TrainHooks hooks;
    hooks.before_step = [&](train::Training& t, int64_t step) {
      if (step != 1) return;
      if (optimizer_batches && rank == 0)
        for (const std::string& dir : {c.memory.fsdp_offload_dir + "/rank0.optimizer", c.memory.optimizer_offload_dir + "/rank0"})
          if (std::filesystem::is_directory(dir))
            for (const auto& e : std::filesystem::directory_iterator(dir))
              if (const std::string f = e.path().filename().string(); f.rfind("batch", 0) == 0) {
                const size_t dot = f.find('.');  // batch<b>.<state name>.<entry>
                (*optimizer_batches)[f.substr(0, dot)].insert(f.substr(dot + 1, f.rfind('.') - dot - 1));
              }
      if (t.offloaded.empty()) return;
      const std::string mine = c.memory.fsdp_offload_dir + "/rank" + std::to_string(rank) + ".unit";
      for (const auto& e : std::filesystem::recursive_directory_iterator(c.memory.fsdp_offload_dir))
        if (e.path().string().rfind(mine, 0) == 0 && e.path().extension() == ".param") ++*shard_files;
    };
    results[rank] = train::run_training(c, hooks);
  });
  for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
  return results[0].losses;
}

// As losses(c), with the most activation files any rank's swap directory held after a
// block's forward (every block's post-hook counts them).
std::vector<double> swapped_losses(const train::TrainConfig& c, std::atomic<int>* most_files) {
  std::vector<train::TrainResult> results(c.world_size());
  comm::run_local_ranks(static_cast<int>(c.world_size()), [&](int rank) {
    const std::string mine = c.memory.activation_swap_dir + "/rank" + std::to_string(rank);
    train::TrainHooks hooks;
    hooks.on_built = [&](train::Training& t) {
      for (auto& [name, module] : t.model->named_modules())
        if (name.rfind("layers.", 0) == 0 && name.find('.', 7) == std::string::npos)
          module->register_forward_hook([&, mine](nn::Module&, const DTensor&, const DTensor& out) {
            int n = 0;
            if (std::filesystem::is_directory(mine))
              for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(mine)) ++n;
            for (int m = most_files->load(); n > m && !most_files->compare_exchange_weak(m, n);) {
            }
            return out;
          });
    };
    results[rank] = train::run_training(c, hooks);
  });
  for (size_t r = 1; r < results.size(); ++r) EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
  return results[0].losses;
}

std::string fresh_dir() {
  char tmpl[] = "/tmp/hp_train_offload_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp failed";
  return tmpl;
}

void expect_same(const std::string& dim, const std::string& dp, const std::string& mode, double budget = 0,
                 bool offload = false, bool release_at_next_region = false) {
  const train::TrainConfig plain = config(dim, dp);
  train::TrainConfig c = plain;
  c.memory.activation_checkpoint = mode;
  c.memory.memory_budget = budget;
  c.memory.release_at_next_region = release_at_next_region;
  std::string dir, swap_dir;
  if (mode == "swap") c.memory.activation_swap_dir = swap_dir = fresh_dir();
  if (offload) {
    dir = fresh_dir();
    c.memory.optimizer_offload_dir = dir;
    c.memory.optimizer_offload_batch_mib = 1;
  }
  const double before = memory::recompute_seconds();
  const std::vector<double> want = losses(plain);
  EXPECT_EQ(memory::recompute_seconds(), before) << "the run without checkpointing recomputed";
  std::atomic<int> swap_files{0};
  EXPECT_EQ(mode == "swap" ? swapped_losses(c, &swap_files) : losses(c), want)
      << dim << "=2 " << dp << " " << mode << " budget " << budget << " offload " << offload;
  if (mode == "swap") EXPECT_GT(swap_files.load(), 0) << "no activation reached " << swap_dir;
  // The keys reached the model: the same losses with nothing recomputed would prove nothing.
  // Swapping alone recomputes nothing (its files above are the proof).
  if (mode == "swap" && budget == 0)
    EXPECT_EQ(memory::recompute_seconds(), before) << "swapping alone recomputed";
  else
    EXPECT_GT(memory::recompute_seconds(), before) << mode << " checkpointing recomputed nothing";
  EXPECT_LT(want.back(), want.front());
  if (!dir.empty()) std::filesystem::remove_all(dir);
  if (!swap_dir.empty()) {
    EXPECT_TRUE(std::filesystem::is_empty(swap_dir)) << "activation files left behind in " << swap_dir;
    std::filesystem::remove_all(swap_dir);
  }
}

// Every tensor of two checkpoints (parameters, optimizer state), bitwise; returns how many.
size_t expect_same_tensors(const std::string& a, const std::string& b) {
  const auto ma = checkpoint::read_metadata(a), mb = checkpoint::read_metadata(b);
  EXPECT_EQ(ma.scalars, mb.scalars);
  EXPECT_EQ(ma.tensors.size(), mb.tensors.size());
  for (const auto& [name, _] : ma.tensors)
    EXPECT_TRUE(mb.tensors.count(name) && at::equal(checkpoint::read_tensor(a, name), checkpoint::read_tensor(b, name)))
        << name;
  return ma.tensors.size();
}

}  // namespace

TEST(MemoryTraining, Pp2FullCheckpointing) { expect_same("pp", "ddp", "full"); }
TEST(MemoryTraining, Pp2Selective) { expect_same("pp", "ddp", "selective"); }
TEST(MemoryTraining, Tp2SelectiveBudget) { expect_same("tp", "ddp", "selective", 0.5); }
TEST(MemoryTraining, Tp2Swap) { expect_same("tp", "ddp", "swap"); }
TEST(MemoryTraining, Tp2SwapBudget) { expect_same("tp", "ddp", "swap", 0.4); }
TEST(MemoryTraining, Pp2Swap) { expect_same("pp", "ddp", "swap"); }
TEST(MemoryTraining, Pp2SwapReleasedAtTheNextRegion) { expect_same("pp", "ddp", "swap", 0, false, true); }
TEST(MemoryTraining, Pp2SelectiveBudgetReleasedAtTheNextRegion) {
  expect_same("pp", "ddp", "selective", 0.4, false, /*release_at_next_region=*/true);
}
TEST(MemoryTraining, FsdpFullCheckpointingAndOptimizerOffload) { expect_same("dp", "fsdp", "full", 0, true); }

// memory.chunked_modules: the blocks recomputed with their MLPs as regions of their own,
// in token chunks (dp: 4 sequences of 16 tokens per rank, 8 chunks of half a sequence; pp:
// 1F1B over 4 microbatches of 2 sequences, 8 chunks of a quarter). The
// weight gradients are the chunks' sums: float32 close, the first step's loss bitwise.
void expect_chunked_close(const std::string& dim, const std::string& mode) {
  const train::TrainConfig plain = config(dim, "ddp");
  train::TrainConfig c = plain;
  c.memory.activation_checkpoint = mode;
  c.memory.chunked_modules = {"layers.*.mlp"};
  c.memory.token_chunks = 8;
  const std::vector<double> want = losses(plain);
  const double before = memory::recompute_seconds();
  const std::vector<double> got = losses(c);
  EXPECT_GT(memory::recompute_seconds(), before);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got[0], want[0]);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << dim << " " << mode << " step " << i;
  EXPECT_LT(want.back(), want.front());
}

TEST(MemoryTraining, DdpFullWithChunkedMlp) { expect_chunked_close("dp", "full"); }
TEST(MemoryTraining, DdpSelectiveWithChunkedMlp) { expect_chunked_close("dp", "selective"); }
TEST(MemoryTraining, Pp2FullWithChunkedMlp) { expect_chunked_close("pp", "full"); }

// fully_shard's shards in files, the optimizer streaming them: with clipping (which brings
// every gradient in) and without (the optimizer brings each batch in), on 2 ranks and on 3
// (uneven shards).
TEST(MemoryTraining, FsdpOffloadToFiles) {
  for (int64_t dp : {2, 3})
    for (double clip : {1.0, 0.0}) {
      train::TrainConfig plain = config("dp", "fsdp");
      plain.mesh.shape = {dp}, plain.train.batch = 6, plain.train.grad_clip = clip;
      train::TrainConfig c = plain;
      c.memory.fsdp_offload_dir = fresh_dir();
      c.memory.optimizer_offload_batch_mib = 1;
      const std::vector<double> want = losses(plain);
      std::atomic<int> shard_files{0};
      EXPECT_EQ(offloaded_losses(c, &shard_files), want) << "dp " << dp << " grad_clip " << clip;
      EXPECT_GT(shard_files.load(), 0) << "no shard files";
      EXPECT_LT(want.back(), want.front());
      std::filesystem::remove_all(c.memory.fsdp_offload_dir);
    }
}

TEST(MemoryTraining, FsdpOffloadNeedsFullyShard) {
  train::TrainConfig c = config("dp", "ddp");
  c.memory.fsdp_offload_dir = "/tmp/unused";
  try {
    losses(c);
    ADD_FAILURE() << "expected an error";
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.fsdp_offload_dir offloads fully_shard's shards"), std::string::npos)
        << e.what();
  }
}

// Checkpoints with state in files: fully_shard's shards and AdamW's state (synchronous and
// asynchronous saves), and AdamW's state alone. They hold bitwise what the run without
// offload saves; a run that lost its last checkpoint resumes from the one before and ends
// bitwise equal. The monitor's replica check reads the tp-replicated norms. dp 2 x tp 2.
TEST(MemoryTraining, CheckpointsWithStateInFiles) {
  struct Case {
    bool shards, async;
  };
  for (const Case k : {Case{true, false}, Case{true, true}, Case{false, false}}) {
    train::TrainConfig plain = config("dp", "fsdp");
    plain.mesh.shape = {2, 2}, plain.mesh.names = {"dp", "tp"}, plain.mesh.sequence_parallel = false;
    plain.train.steps = 6;
    plain.checkpoint.dir = fresh_dir(), plain.checkpoint.every = 3, plain.checkpoint.keep = 0;
    plain.checkpoint.async = k.async;
    plain.monitor.replica_check_every = 2;
    train::TrainConfig c = plain;
    c.checkpoint.dir = fresh_dir();
    (k.shards ? c.memory.fsdp_offload_dir : c.memory.optimizer_offload_dir) = fresh_dir();
    c.memory.optimizer_offload_batch_mib = 1;
    const std::string where = std::string(k.shards ? "shards and state" : "optimizer state") + " in files, " +
                              (k.async ? "async saves" : "synchronous saves");

    const std::vector<double> want = losses(plain);
    std::atomic<int> shard_files{0};
    EXPECT_EQ(offloaded_losses(c, &shard_files), want) << where;
    EXPECT_EQ(shard_files.load() > 0, k.shards) << where;
    const std::string last = checkpoint::step_dir(plain.checkpoint.dir, 6), mine = checkpoint::step_dir(c.checkpoint.dir, 6);
    {
      SCOPED_TRACE(where + ", the uninterrupted run's last checkpoint");
      EXPECT_GT(expect_same_tensors(last, mine), 0u);
    }
    std::filesystem::remove_all(mine);
    const train::TrainResult resumed = hp::testing::run_on_all_ranks(c);
    EXPECT_EQ(resumed.first_step, 3) << where;
    EXPECT_EQ(resumed.losses, std::vector<double>(want.begin() + 3, want.end())) << where;
    SCOPED_TRACE(where + ", the resumed run's last checkpoint");
    expect_same_tensors(last, mine);
    for (const std::string& d : {plain.checkpoint.dir, c.checkpoint.dir, c.memory.fsdp_offload_dir + c.memory.optimizer_offload_dir})
      std::filesystem::remove_all(d);
  }
}

// The MoE Llama with its shards in files (dp 2 x ep 2: the non-expert units over dp x ep,
// the experts' over dp): the losses and last checkpoint of the run without offload, bitwise.
TEST(MemoryTraining, MoEFsdpOffloadToFiles) {
  train::TrainConfig plain = config("dp", "fsdp");
  plain.mesh.shape = {2, 2}, plain.mesh.names = {"dp", "ep"};
  plain.model.layers = 2;
  plain.moe.num_experts = 4, plain.moe.top_k = 2, plain.moe.hidden_dim = 16, plain.moe.dense_layers = 1;
  plain.moe.aux_loss_coef = 0.01, plain.moe.load_balance_bias = true, plain.moe.bias_update_rate = 0.01;
  plain.checkpoint.dir = fresh_dir(), plain.checkpoint.keep = 0;
  train::TrainConfig c = plain;
  c.checkpoint.dir = fresh_dir();
  c.memory.fsdp_offload_dir = fresh_dir();
  c.memory.optimizer_offload_batch_mib = 1;

  const std::vector<double> want = losses(plain);
  std::atomic<int> shard_files{0};
  EXPECT_EQ(offloaded_losses(c, &shard_files), want);
  EXPECT_GT(shard_files.load(), 0);
  EXPECT_LT(want.back(), want.front());
  EXPECT_GT(expect_same_tensors(checkpoint::step_dir(plain.checkpoint.dir, 5), checkpoint::step_dir(c.checkpoint.dir, 5)),
            0u);
  for (const std::string& d : {plain.checkpoint.dir, c.checkpoint.dir, c.memory.fsdp_offload_dir})
    std::filesystem::remove_all(d);
}

// Muon (the blocks' matrices) and AdamW (the rest) with their state in files, and with
// fully_shard's shards too, on 2 ranks and on 3 (uneven shards): batches of 1 MiB, the
// embedding's alone (no matrix: its chain must follow Muon's rate as the others do), cut
// alike on every rank. Losses and last checkpoint bitwise those of the run
// without offload.
TEST(MemoryTraining, MuonWithStateInFiles) {
  for (int64_t dp : {2, 3})
    for (bool shards : {false, true}) {
      const std::string where = "dp " + std::to_string(dp) + (shards ? ", shards in files" : ", state in files");
      train::TrainConfig plain = config("dp", "fsdp");
      plain.mesh.shape = {dp}, plain.train.batch = 6, plain.train.steps = 4;
      plain.model.vocab = 4096, plain.model.dim = 256, plain.model.ffn_dim = 512, plain.model.layers = 2;
      plain.train.optimizer = "muon", plain.train.muon_lr = 0.02;
      plain.checkpoint.dir = fresh_dir(), plain.checkpoint.keep = 0;
      train::TrainConfig c = plain;
      c.checkpoint.dir = fresh_dir();
      const std::string dir = fresh_dir();
      (shards ? c.memory.fsdp_offload_dir : c.memory.optimizer_offload_dir) = dir;
      c.memory.optimizer_offload_batch_mib = 1;

      const std::vector<double> want = losses(plain);
      std::atomic<int> shard_files{0};
      std::map<std::string, std::set<std::string>> batches;
      EXPECT_EQ(offloaded_losses(c, &shard_files, &batches), want) << where;
      EXPECT_EQ(shard_files.load() > 0, shards) << where;
      EXPECT_GE(batches.size(), 3u) << where;
      EXPECT_TRUE(std::any_of(batches.begin(), batches.end(), [](const auto& b) { return !b.second.count("momentum"); }))
          << where << ": every batch has a matrix";
      EXPECT_TRUE(std::any_of(batches.begin(), batches.end(), [](const auto& b) { return b.second.count("momentum"); }))
          << where << ": no batch has a matrix";
      SCOPED_TRACE(where + ", the last checkpoint");
      EXPECT_GT(expect_same_tensors(checkpoint::step_dir(plain.checkpoint.dir, 4), checkpoint::step_dir(c.checkpoint.dir, 4)),
                0u);
      for (const std::string& d : {plain.checkpoint.dir, c.checkpoint.dir, dir}) std::filesystem::remove_all(d);
    }
}

// Pipeline stages with their shards in files, pp 2 x dp 2 with fully_shard: 1F1B (one chunk
// per rank) and interleaved 1F1B (two, each its own root unit); gradients accumulate in
// the files over the microbatches. The losses of the run without offload, bitwise.
TEST(MemoryTraining, PipelineFsdpOffloadToFiles) {
  for (const std::string schedule : {"1f1b", "interleaved-1f1b"}) {
    train::TrainConfig plain = config("dp", "fsdp");
    plain.mesh.shape = {2, 2}, plain.mesh.names = {"pp", "dp"};
    plain.pipeline.schedule = schedule;
    train::TrainConfig c = plain;
    c.memory.fsdp_offload_dir = fresh_dir();
    c.memory.optimizer_offload_batch_mib = 1;
    const std::vector<double> want = losses(plain);
    std::atomic<int> shard_files{0};
    EXPECT_EQ(offloaded_losses(c, &shard_files), want) << schedule;
    EXPECT_GT(shard_files.load(), 0) << schedule;
    EXPECT_LT(want.back(), want.front());
    std::filesystem::remove_all(c.memory.fsdp_offload_dir);
  }
}
