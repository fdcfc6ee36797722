// `hp train` with mesh.async_tp against the same configuration without it (ranks as
// threads): the loss of every step and every parameter after 5 AdamW steps, bitwise
// (tests/parallel/async_tp_test.cpp says why the pieces give the same bits). Each layout
// is one line: tensor parallelism beside ddp, inside pipeline stages, and beside experts
// over ep in a MoE model (attention and the dense block in pieces).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <sstream>

#include "hp/checkpoint.h"
#include "hp/comm/trace.h"
#include "hp/train/trainer.h"
#include "train/trainer_runs.h"

using namespace hp;

namespace {

struct Layout {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  bool moe = false;  // 1 dense block, 1 MoE block of 4 experts, top-2
};

void PrintTo(const Layout& l, std::ostream* os) {
  for (size_t i = 0; i < l.shape.size(); ++i) *os << (i ? "_x_" : "") << l.names[i] << l.shape[i];
  if (l.moe) *os << "_moe";
}

train::TrainConfig config(const Layout& l, bool async_tp, const std::string& dir) {
  train::TrainConfig c;
  c.mesh.shape = l.shape;
  c.mesh.names = l.names;
  c.mesh.sequence_parallel = true;
  c.mesh.async_tp = async_tp;
  c.model.dim = 32, c.model.layers = 2, c.model.heads = 4, c.model.kv_heads = 2, c.model.ffn_dim = 64;
  c.model.max_seq = 16;
  c.train.steps = 5, c.train.batch = 8, c.train.seq = 16, c.train.lr = 1e-2, c.train.warmup = 2;
  c.train.deterministic = true;
  c.checkpoint.dir = dir, c.checkpoint.keep = 0, c.checkpoint.async = false;
  if (l.moe) c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.hidden_dim = 16, c.moe.dense_layers = 1;
  return c;
}

// Runs `c` and counts the matmuls of pieces it traced: proof the key reached the model.
std::pair<train::TrainResult, int64_t> run_counting_pieces(const train::TrainConfig& c) {
  trace::set_enabled(true);
  trace::clear();
  train::TrainResult r = hp::testing::run_on_all_ranks(c);
  int64_t pieces = 0;
  for (const auto& e : trace::events()) pieces += e.name.rfind("matmul piece", 0) == 0;
  trace::set_enabled(false);
  trace::clear();
  return {r, pieces};
}

class AsyncTPTraining : public ::testing::TestWithParam<Layout> {};

}  // namespace

TEST_P(AsyncTPTraining, BitwiseEqualWithoutIt) {
  const std::string whole_dir = hp::testing::fresh_dir("hp_async_tp", "whole");
  const std::string pieces_dir = hp::testing::fresh_dir("hp_async_tp", "pieces");
  const auto [whole, whole_pieces] = run_counting_pieces(config(GetParam(), false, whole_dir));
  const auto [pieces, pieces_pieces] = run_counting_pieces(config(GetParam(), true, pieces_dir));
  EXPECT_EQ(whole_pieces, 0);
  EXPECT_GT(pieces_pieces, 0);
  EXPECT_EQ(pieces.losses, whole.losses);
  EXPECT_LT(whole.losses.back(), whole.losses.front());
  const int n = hp::testing::expect_close_params(checkpoint::step_dir(pieces_dir, 5),
                                                 checkpoint::step_dir(whole_dir, 5), 0, 0, "async_tp");
  // embedding, head, final norm; 9 per dense block; MoE block: 2 norms, 4 attention, gate,
  // w1-w3, expert bias
  EXPECT_EQ(n, GetParam().moe ? 3 + 9 + 11 : 3 + 2 * 9);
  std::filesystem::remove_all(whole_dir);
  std::filesystem::remove_all(pieces_dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AsyncTPTraining,
                         ::testing::Values(Layout{{2, 2}, {"dp", "tp"}}, Layout{{2, 2}, {"pp", "tp"}},
                                           Layout{{2, 2}, {"ep", "tp"}, true}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           std::ostringstream os;
                           PrintTo(i.param, &os);
                           return os.str();
                         });
