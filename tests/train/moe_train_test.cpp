// `hp train` with a [moe] model (ranks as threads) against the single-process run of the
// same configuration: the loss of every step and every parameter after 5 AdamW steps (read
// back from the last checkpoint), float32, relative 1e-5 with an absolute floor of 1e-6
// for losses and 5e-6 for parameters: AdamW divides by the root of a byte's squared
// gradient, so a head row of a byte the batch never holds (gradient ~1e-9, from the
// softmax alone) moves by lr whatever its rounding, and the head's gradient is summed over
// the data ranks in another order.
// The model: 2 blocks (1 dense, 1 MoE of 4 experts, top-2, aux loss and expert bias on).
// Each layout is one line.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <filesystem>

#include "hp/checkpoint.h"
#include "hp/comm/local_ranks.h"
#include "hp/train/trainer.h"
#include "train/trainer_runs.h"

using namespace hp;
namespace fs = std::filesystem;

namespace {

struct Layout {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::string data_parallel = "ddp";
};

std::string describe(const Layout& l) {
  std::string s;
  for (size_t i = 0; i < l.shape.size(); ++i) s += (i ? " x " : "") + l.names[i] + "=" + std::to_string(l.shape[i]);
  return s + " " + l.data_parallel;
}

void PrintTo(const Layout& l, std::ostream* os) { *os << describe(l); }

train::TrainConfig config(const Layout& l, const std::string& dir) {
  train::TrainConfig c;
  c.mesh.shape = l.shape, c.mesh.names = l.names, c.mesh.data_parallel = l.data_parallel;
  c.model.dim = 32, c.model.layers = 2, c.model.heads = 4, c.model.kv_heads = 2, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.hidden_dim = 16, c.moe.dense_layers = 1;
  c.moe.aux_loss_coef = 0.01, c.moe.load_balance_bias = true, c.moe.bias_update_rate = 0.01;
  c.train.steps = 5, c.train.batch = 8, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.deterministic = true;
  c.checkpoint.dir = dir, c.checkpoint.keep = 0, c.checkpoint.async = false;
  return c;
}

std::string fresh_dir(const std::string& tag) { return hp::testing::fresh_dir("hp_moe_train", tag); }

using hp::testing::run_on_all_ranks;

struct Reference {
  train::TrainResult result;
  std::string dir;
};

const Reference& reference() {
  static Reference r = [] {
    Reference ref;
    ref.dir = fresh_dir("reference");
    ref.result = run_on_all_ranks(config(Layout{{1}, {"dp"}}, ref.dir));
    return ref;
  }();
  return r;
}

class MoETraining : public ::testing::TestWithParam<Layout> {};

TEST_P(MoETraining, MatchesSingleProcess) {
  const Layout& l = GetParam();
  const std::string where = describe(l), dir = fresh_dir("layout");
  const Reference& ref = reference();
  const train::TrainResult got = run_on_all_ranks(config(l, dir));
  hp::testing::expect_close_losses(got.losses, ref.result.losses, 1e-5, where);
  EXPECT_LT(ref.result.losses.back(), ref.result.losses.front());
  const int compared = hp::testing::expect_close_params(checkpoint::step_dir(ref.dir, 5), checkpoint::step_dir(dir, 5),
                                                        1e-5, 5e-6, where);
  // embedding, head, final norm; dense block 9; MoE block: 2 norms, 4 attention, gate, w1-w3
  EXPECT_EQ(compared, 3 + 9 + 10) << where;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoETraining,
                         ::testing::Values(Layout{{2, 2}, {"dp", "ep"}}, Layout{{4}, {"ep"}},
                                           Layout{{2, 2}, {"dp", "ep"}, "fsdp"}, Layout{{2, 2}, {"ep", "tp"}}));

}  // namespace
