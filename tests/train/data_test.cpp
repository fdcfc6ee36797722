#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "hp/base/error.h"
#include "hp/train/data.h"

using hp::train::DataLoader;

namespace {

// Tokens whose values encode their position, so windows can be checked directly.
std::vector<int64_t> ramp(int64_t n) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i;
  return t;
}

std::string error_of(std::function<void()> f) {
  try {
    f();
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DataLoader, ShapesAndShiftedTargets) {
  DataLoader loader(ramp(1000), /*seq=*/16, /*global_batch=*/4);
  auto b = loader.next();
  EXPECT_EQ(b.step, 0);
  EXPECT_EQ(b.inputs.sizes(), (at::IntArrayRef{4, 16}));
  EXPECT_EQ(b.targets.sizes(), (at::IntArrayRef{4, 16}));
  EXPECT_EQ(b.inputs.scalar_type(), at::kLong);
  EXPECT_EQ(b.targets.scalar_type(), at::kLong);
  EXPECT_TRUE(b.inputs.is_contiguous());
  EXPECT_TRUE(b.targets.is_contiguous());
  // A ramp makes every window consecutive and targets one ahead.
  EXPECT_TRUE(at::equal(b.targets, b.inputs + 1));
  auto first = b.inputs.select(1, 0);
  EXPECT_TRUE(at::equal(b.inputs, first.unsqueeze(1) + at::arange(16, at::kLong)));
  for (int64_t r = 0; r < 4; ++r) {
    int64_t start = b.inputs[r][0].item<int64_t>();
    EXPECT_EQ(start, loader.window_start(0, r));
    EXPECT_GE(start, 0);
    EXPECT_LE(start + 16, 999);  // the last target is still inside the corpus
  }
}

TEST(DataLoader, DpSlicesConcatenateToSingleProcessBatch) {
  auto tokens = hp::train::encode(hp::train::read_text(""));
  const int64_t seq = 32, global = 8, steps = 5;
  DataLoader single(tokens, seq, global, 0, 1, /*seed=*/7);
  for (int64_t dp : {1, 2, 4}) {
    std::vector<DataLoader> ranks;
    for (int64_t r = 0; r < dp; ++r) ranks.emplace_back(tokens, seq, global, r, dp, 7);
    single.seek(0);
    for (int64_t k = 0; k < steps; ++k) {
      auto want = single.next();
      std::vector<at::Tensor> in, tg;
      for (auto& l : ranks) {
        auto b = l.next();
        EXPECT_EQ(b.step, k);
        EXPECT_EQ(b.inputs.size(0), global / dp);
        in.push_back(b.inputs);
        tg.push_back(b.targets);
      }
      EXPECT_TRUE(at::equal(at::cat(in), want.inputs)) << "dp=" << dp << " step=" << k;
      EXPECT_TRUE(at::equal(at::cat(tg), want.targets)) << "dp=" << dp << " step=" << k;
    }
  }
}

TEST(DataLoader, DeterministicBySeed) {
  auto tokens = ramp(5000);
  DataLoader a(tokens, 8, 4, 0, 1, 1), b(tokens, 8, 4, 0, 1, 1), c(tokens, 8, 4, 0, 1, 2);
  bool any_differs_from_other_seed = false, steps_differ = false;
  at::Tensor prev;
  for (int k = 0; k < 10; ++k) {
    auto x = a.next(), y = b.next(), z = c.next();
    EXPECT_TRUE(at::equal(x.inputs, y.inputs));
    EXPECT_TRUE(at::equal(x.targets, y.targets));
    any_differs_from_other_seed |= !at::equal(x.inputs, z.inputs);
    if (prev.defined()) steps_differ |= !at::equal(prev, x.inputs);
    prev = x.inputs;
  }
  EXPECT_TRUE(any_differs_from_other_seed);
  EXPECT_TRUE(steps_differ);
}

TEST(DataLoader, IgnoresGlobalTorchSeed) {
  auto tokens = ramp(5000);
  at::manual_seed(1);
  auto x = DataLoader(tokens, 8, 4, 0, 1, 3).next();
  at::manual_seed(2);
  auto y = DataLoader(tokens, 8, 4, 0, 1, 3).next();
  EXPECT_TRUE(at::equal(x.inputs, y.inputs));
}

TEST(DataLoader, SeekGivesThatStepsBatch) {
  auto tokens = ramp(5000);
  DataLoader run(tokens, 8, 4, 1, 2, 5);
  std::vector<at::Tensor> seen;
  for (int k = 0; k < 6; ++k) seen.push_back(run.next().inputs);
  EXPECT_EQ(run.position(), 6);

  DataLoader resumed(tokens, 8, 4, 1, 2, 5);
  resumed.seek(3);
  EXPECT_EQ(resumed.position(), 3);
  for (int k = 3; k < 6; ++k) {
    auto b = resumed.next();
    EXPECT_EQ(b.step, k);
    EXPECT_TRUE(at::equal(b.inputs, seen[k])) << "step " << k;
  }
  EXPECT_TRUE(at::equal(resumed.batch(2).inputs, seen[2]));  // batch() does not move
  EXPECT_EQ(resumed.position(), 6);
}

TEST(DataLoader, CorpusOfExactlySeqPlusOne) {
  DataLoader l(ramp(9), 8, 2);
  auto b = l.next();
  EXPECT_TRUE(at::equal(b.inputs[0], at::arange(8, at::kLong)));
  EXPECT_TRUE(at::equal(b.inputs[1], at::arange(8, at::kLong)));
}

TEST(DataLoader, Errors) {
  auto m = error_of([] { DataLoader(ramp(100), 8, 6, 0, 4); });
  EXPECT_NE(m.find("global batch 6 is not divisible by dp size 4"), std::string::npos) << m;
  m = error_of([] { DataLoader(ramp(8), 8, 2); });
  EXPECT_NE(m.find("corpus has 8 tokens, needs at least seq + 1 = 9"), std::string::npos) << m;
  m = error_of([] { DataLoader(ramp(100), 8, 4, 2, 2); });
  EXPECT_NE(m.find("dp rank 2"), std::string::npos) << m;
  m = error_of([] { DataLoader(ramp(100), 8, 4).seek(-1); });
  EXPECT_NE(m.find("seek to step -1"), std::string::npos) << m;
}
