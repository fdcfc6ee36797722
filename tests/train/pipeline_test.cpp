// `hp train` with pipeline stages (ranks as threads) against the pp = 1 run of the same
// configuration (the single process, or the same dp/tp mesh without pp): the loss of every step and every parameter after 5 AdamW steps,
// float32, relative 1e-5 with an absolute floor of 1e-6. Each layout is one line: schedule
// kinds at pp = 2, 3 and 4 (uneven splits included), tensor parallelism, ddp, fully_shard
// (ZeRO-1, -2 and -3) and replicate inside stages; then checkpoints that resume across a pp change.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "hp/checkpoint.h"
#include "hp/train/trainer.h"
#include "train/trainer_runs.h"

using namespace hp;
namespace fs = std::filesystem;

namespace {

using hp::testing::run_on_all_ranks;
std::string fresh_dir(const std::string& tag) { return hp::testing::fresh_dir("hp_pipeline", tag); }

// Parameters after 5 AdamW steps at lr 1e-2: microbatches and the ranks' partial sums add
// in other orders than the reference's, and Adam's normalised step turns a last-bit
// difference of a near-zero gradient into up to a few 1e-6 (3.7e-6 seen); a wrong gradient
// moves a parameter by the order of lr.
constexpr double kRtol = 1e-5, kAtol = 1e-5;

struct Layout {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::string schedule = "1f1b";
  std::string data_parallel = "ddp";
  int64_t microbatches = 0;
  bool sequence_parallel = false;
  std::vector<int64_t> split;
};

train::TrainConfig config(const Layout& l, const std::string& dir) {
  train::TrainConfig c;
  c.mesh.shape = l.shape;
  c.mesh.names = l.names;
  c.mesh.data_parallel = l.data_parallel;
  c.mesh.sequence_parallel = l.sequence_parallel;
  c.pipeline.schedule = l.schedule;
  c.pipeline.microbatches = l.microbatches;
  c.pipeline.split = l.split;
  c.model.dim = 32, c.model.layers = 8, c.model.heads = 4, c.model.kv_heads = 2, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = 5, c.train.batch = 8, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.deterministic = true;
  c.checkpoint.dir = dir, c.checkpoint.keep = 0, c.checkpoint.async = false;
  return c;
}

std::string describe(const Layout& l) {
  std::string s;
  for (size_t i = 0; i < l.shape.size(); ++i) s += (i ? " x " : "") + l.names[i] + "=" + std::to_string(l.shape[i]);
  return s + " " + l.schedule + " " + l.data_parallel;
}

void PrintTo(const Layout& l, std::ostream* os) { *os << describe(l); }

using hp::testing::Reference;

// The pp = 1 run of `l`: its other dims kept (tensor parallelism sums in its own order),
// one process when there are none.
const Reference& reference(const Layout& l) {
  Layout flat{{1}, {"dp"}};
  flat.data_parallel = l.data_parallel, flat.sequence_parallel = l.sequence_parallel;
  for (size_t i = 0; i < l.shape.size(); ++i)
    if (l.names[i] != "pp") flat.shape.push_back(l.shape[i]), flat.names.push_back(l.names[i]);
  if (flat.shape.size() > 1) flat.shape.erase(flat.shape.begin()), flat.names.erase(flat.names.begin());
  return hp::testing::cached_reference(describe(flat), "reference", fresh_dir,
                                       [&](const std::string& dir) { return config(flat, dir); });
}

class PipelineTraining : public ::testing::TestWithParam<Layout> {};

TEST_P(PipelineTraining, MatchesSingleProcess) {
  const Layout& l = GetParam();
  const std::string dir = fresh_dir("layout");
  const std::string where = describe(l);
  const Reference& ref = reference(l);
  train::TrainResult got = run_on_all_ranks(config(l, dir));
  hp::testing::expect_close_losses(got.losses, ref.result.losses, kRtol, where);
  const int n = hp::testing::expect_close_params(checkpoint::step_dir(ref.dir, 5), checkpoint::step_dir(dir, 5), kRtol, kAtol, where);
  EXPECT_EQ(n, 2 + 8 * 9 + 1) << where;  // embedding, head; 9 per block; final norm
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineTraining,
    ::testing::Values(Layout{{2}, {"pp"}, "1f1b"}, Layout{{4}, {"pp"}, "gpipe"}, Layout{{4}, {"pp"}, "1f1b"},
                      Layout{{4}, {"pp"}, "interleaved-1f1b"}, Layout{{4}, {"pp"}, "zb-h1"},
                      Layout{{4}, {"pp"}, "zbv"}, Layout{{4}, {"pp"}, "dualpipev"}, Layout{{3}, {"pp"}, "1f1b", "ddp", 4},
                      Layout{{2}, {"pp"}, "zbv", "ddp", 0, false, {1, 3, 4, 0}},
                      Layout{{2, 2}, {"pp", "dp"}, "1f1b", "ddp"}, Layout{{2, 2}, {"pp", "dp"}, "gpipe", "fsdp"},
                      Layout{{2, 2}, {"pp", "dp"}, "interleaved-1f1b", "ddp"},
                      Layout{{2, 2}, {"pp", "dp"}, "zb-h1", "replicate"},
                      Layout{{2, 2}, {"pp", "dp"}, "dualpipev", "replicate"},
                      Layout{{2, 2}, {"pp", "dp"}, "zbv", "ddp"}, Layout{{2, 2}, {"dp", "pp"}, "zb-h1", "ddp"},
                      Layout{{2, 2}, {"pp", "tp"}, "1f1b", "ddp", 0, true},
                      Layout{{2, 2}, {"dp", "pp"}, "interleaved-1f1b", "fsdp"},
                      Layout{{2, 2}, {"pp", "dp"}, "1f1b", "zero1"},
                      Layout{{2, 2}, {"pp", "dp"}, "interleaved-1f1b", "zero2"}));

TEST(PipelineTrainingResume, ACheckpointFromPp2ResumesAtPp1AndPp4) {
  // Step 3 of a pp = 2 run, resumed at pp = 1 and at pp = 4 (tensors reshard as they load,
  // the position comes back): both end as the uninterrupted single process does.
  train::TrainConfig ref_cfg = config({{1}, {"dp"}}, fresh_dir("resume_ref"));
  ref_cfg.train.steps = 6;
  const train::TrainResult ref = run_on_all_ranks(ref_cfg);
  for (const Layout& later : {Layout{{1}, {"dp"}}, Layout{{4}, {"pp"}, "1f1b"}}) {
    const std::string dir = fresh_dir("resume");
    train::TrainConfig first = config({{2}, {"pp"}}, dir);
    first.train.steps = 6, first.checkpoint.every = 3;
    run_on_all_ranks(first);
    fs::remove_all(checkpoint::step_dir(dir, 6));
    train::TrainConfig second = config(later, dir);
    second.train.steps = 6, second.checkpoint.every = 3;
    train::TrainResult resumed = run_on_all_ranks(second);
    EXPECT_EQ(resumed.first_step, 3) << describe(later);
    hp::testing::expect_close_losses(resumed.losses, ref.losses, kRtol, "resumed at " + describe(later), 3);
    hp::testing::expect_close_params(checkpoint::step_dir(ref_cfg.checkpoint.dir, 6), checkpoint::step_dir(dir, 6),
                                     kRtol, kAtol, "resumed at " + describe(later));
    fs::remove_all(dir);
  }
}

TEST(PipelineTrainingResume, DeterministicPp2x2RunsAgreeAndResumeBitwise) {
  // Deterministic mode across stages: two runs agree bitwise, and a run resumed from step 3
  // at the same layout ends with bitwise the parameters and optimizer state.
  const Layout l{{2, 2}, {"pp", "dp"}, "1f1b", "ddp"};
  const std::string a_dir = fresh_dir("bitwise_a"), b_dir = fresh_dir("bitwise_b");
  train::TrainConfig a = config(l, a_dir), b = config(l, b_dir);
  a.train.steps = b.train.steps = 6;
  a.checkpoint.every = b.checkpoint.every = 3;
  const train::TrainResult ra = run_on_all_ranks(a), rb = run_on_all_ranks(b);
  EXPECT_EQ(ra.losses, rb.losses);
  fs::remove_all(checkpoint::step_dir(b_dir, 6));
  const train::TrainResult resumed = run_on_all_ranks(b);
  EXPECT_EQ(resumed.first_step, 3);
  EXPECT_EQ(resumed.losses, std::vector<double>(ra.losses.begin() + 3, ra.losses.end()));
  const auto ma = checkpoint::read_metadata(checkpoint::step_dir(a_dir, 6));
  EXPECT_EQ(ma.tensors.size(), checkpoint::read_metadata(checkpoint::step_dir(b_dir, 6)).tensors.size());
  for (const auto& [name, _] : ma.tensors)
    EXPECT_TRUE(at::equal(checkpoint::read_tensor(checkpoint::step_dir(a_dir, 6), name),
                          checkpoint::read_tensor(checkpoint::step_dir(b_dir, 6), name)))
        << name;
  fs::remove_all(a_dir), fs::remove_all(b_dir);
}

// Between stages each rank hands on its own piece of an activation, to the rank at its
// place in the next stage's mesh: a step's activation messages carry each rank's piece
// only, and under dp no stage gathers its output or its input gradient (sequence-parallel
// tp gathers inside the blocks). pp 2 x dp 2 and pp 2 x tp 2: rank 0's log of step 3.
TEST(PipelineTrainingPieces, StagesGatherNothingAndSendTheirOwnRows) {
  for (const Layout& l : {Layout{{2, 2}, {"pp", "dp"}, "1f1b", "ddp", 4},
                          Layout{{2, 2}, {"pp", "tp"}, "1f1b", "ddp", 4, true}}) {
    train::TrainConfig c = config(l, fresh_dir("pieces"));
    int64_t gathers = 0, sent = 0;
    for (const auto& r : hp::testing::collectives_of_step(c, 3)) {
      gathers += r.op == "all_gather";
      if (r.op == "send") sent += r.bytes();
    }
    // Rank 0 (stage 0) sends 4 microbatches' activations: its piece of [2, 16, 32] floats
    // (1 of 2 rows under dp; 8 of 16 positions under sequence-parallel tp).
    if (l.names[1] == "dp") EXPECT_EQ(gathers, 0) << describe(l);
    EXPECT_EQ(sent, 4 * 2 * 16 * 32 * 4 / 2) << describe(l);
    fs::remove_all(c.checkpoint.dir);
  }
}

TEST(PipelineTrainingConfig, BadSettingsGetClearErrors) {
  auto message = [](const Layout& l, const std::function<void(train::TrainConfig&)>& edit) {
    train::TrainConfig c = config(l, "");
    edit(c);
    try {
      train::validate(c);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Layout pp4{{4}, {"pp"}, "interleaved-1f1b"};
  EXPECT_NE(message(pp4, [](auto& c) { c.model.layers = 7; }).find("fewer than the 8 pipeline chunks"),
            std::string::npos);
  EXPECT_NE(message(pp4, [](auto& c) { c.model.tied_embeddings = true; }).find("tied_embeddings"), std::string::npos);
  EXPECT_NE(message(pp4, [](auto& c) { c.pipeline.schedule = "2f2b"; }).find("unknown schedule kind '2f2b'"),
            std::string::npos);
  EXPECT_NE(message(pp4, [](auto& c) { c.pipeline.microbatches = 3; }).find("train.batch = 8 must be divisible by 3"),
            std::string::npos);
  EXPECT_NE(message(pp4, [](auto& c) { c.pipeline.split = {1, 1, 1, 1, 1, 1, 1, 2}; }).find("pipeline.split"),
            std::string::npos);
  EXPECT_NE(message({{2, 2}, {"pp", "dp"}, "zbv", "fsdp"}, [](auto&) {}).find("splits the backward"),
            std::string::npos);
}

}  // namespace
