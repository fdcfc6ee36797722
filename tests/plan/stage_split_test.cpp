// balance_stages against two references that share no code with it:
//   exhaustive: every way to put n layers into k chunks (empty chunks included);
//   bisection:  the smallest candidate chunk cost that a greedy fill (each chunk takes
//               layers while it stays under the bound) fits into k chunks.
// Slowest chunks must agree within a relative 1e-12 (the split sums through prefix
// sums, the references add layer by layer). Random cases: n <= 10, k <= 5, fixed seed.
// Models (a 3M Llama, llama3-70b at 2..16 chunks): the exhaustive search where there
// are at most 2e5 splits, else the bisection. Which optimal split wins a tie is checked
// on hand-made cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "hp/base/error.h"
#include "hp/plan/flops.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/plan/stage_split.h"

using namespace hp::plan;

namespace {

struct Problem {
  std::vector<double> costs;
  int64_t chunks = 1;
  double first = 0, last = 0;
};

// Chunk j of k holding layers [i, e), added in layer order.
double chunk_cost(const Problem& p, int64_t j, int64_t i, int64_t e) {
  double c = j == 0 ? p.first : 0;
  for (int64_t l = i; l < e; ++l) c += p.costs[l];
  return c + (j == p.chunks - 1 ? p.last : 0);
}

double exhaustive_optimum(const Problem& p) {
  const int64_t n = int64_t(p.costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int64_t, int64_t, double)> place = [&](int64_t j, int64_t i, double worst) {
    if (j == p.chunks - 1) {
      best = std::min(best, std::max(worst, chunk_cost(p, j, i, n)));
      return;
    }
    for (int64_t e = i; e <= n; ++e) place(j + 1, e, std::max(worst, chunk_cost(p, j, i, e)));
  };
  place(0, 0, 0);
  return best;
}

// Ways to put n layers into k ordered chunks, empty ones allowed: C(n + k - 1, k - 1).
double compositions(int64_t n, int64_t k) {
  double r = 1;
  for (int64_t i = 1; i < k; ++i) r = r * double(n + i) / double(i);
  return r;
}

bool greedy_fits(const Problem& p, double bound) {
  const int64_t n = int64_t(p.costs.size());
  int64_t i = 0;
  for (int64_t j = 0; j < p.chunks - 1; ++j) {
    double c = j == 0 ? p.first : 0;
    if (c > bound) return false;
    while (i < n && c + p.costs[i] <= bound) c += p.costs[i++];
  }
  return chunk_cost(p, p.chunks - 1, i, n) <= bound;
}

double bisection_optimum(const Problem& p) {
  const int64_t n = int64_t(p.costs.size()), k = p.chunks;
  std::vector<double> candidates;
  for (int64_t j : {int64_t(0), std::min<int64_t>(1, k - 1), k - 1})
    for (int64_t i = 0; i <= n; ++i)
      for (int64_t e = i; e <= n; ++e) candidates.push_back(chunk_cost(p, j, i, e));
  std::sort(candidates.begin(), candidates.end());
  size_t lo = 0, hi = candidates.size() - 1;  // the largest candidate (everything in one chunk) always fits
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (greedy_fits(p, candidates[mid])) hi = mid; else lo = mid + 1;
  }
  return candidates[lo];
}

double optimum(const Problem& p) {
  return compositions(int64_t(p.costs.size()), p.chunks) <= 2e5 ? exhaustive_optimum(p) : bisection_optimum(p);
}

StageSplit solve(const Problem& p) { return balance_stages(p.costs, p.chunks, p.first, p.last); }

// The split is well formed: one entry per chunk, every layer once, costs as stated.
void expect_consistent(const Problem& p, const StageSplit& s) {
  ASSERT_EQ(int64_t(s.layers.size()), p.chunks);
  ASSERT_EQ(int64_t(s.costs.size()), p.chunks);
  EXPECT_EQ(std::accumulate(s.layers.begin(), s.layers.end(), int64_t(0)), int64_t(p.costs.size()));
  const std::vector<int64_t> first = s.first_layer();
  for (int64_t j = 0; j < p.chunks; ++j) {
    EXPECT_GE(s.layers[j], 0);
    const double want = chunk_cost(p, j, first[j], first[j] + s.layers[j]);
    EXPECT_NEAR(s.costs[j], want, 1e-12 * std::max(1.0, want)) << "chunk " << j;
  }
}

std::string describe(const StageSplit& s) {
  std::string out;
  for (int64_t n : s.layers) out += (out.empty() ? "" : " ") + std::to_string(n);
  return "[" + out + "]";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "(no error)";
}

ModelDesc llama_3m() {
  ModelDesc m;
  m.name = "llama-3m";
  m.vocab = 256;
  m.hidden = 256;
  m.layers = 4;
  m.heads = 8;
  m.kv_heads = 4;
  m.ffn = 688;
  m.seq_len = 256;
  m.validate();
  return m;
}

}  // namespace

TEST(StageSplit, MatchesExhaustiveSearch) {
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<double> cost(0.0, 1.0);
  for (int64_t n = 0; n <= 10; ++n)
    for (int64_t k = 1; k <= 5; ++k)
      for (bool extras : {false, true})
        for (int trial = 0; trial < 50; ++trial) {
          Problem p;
          p.chunks = k;
          for (int64_t l = 0; l < n; ++l) p.costs.push_back(cost(rng));
          // Up to half the model's worth, so that end chunks are often best left empty.
          std::uniform_real_distribution<double> extra(0.0, 0.5 * double(n) + 1);
          if (extras) p.first = extra(rng), p.last = extra(rng);
          const StageSplit s = solve(p);
          expect_consistent(p, s);
          const double want = exhaustive_optimum(p);
          EXPECT_NEAR(s.max_cost(), want, 1e-12 * want) << "n " << n << ", k " << k << ", extras " << extras
                                                        << ", trial " << trial << ": split " << describe(s);
          EXPECT_NEAR(bisection_optimum(p), want, 1e-12 * want) << "the bisection reference, n " << n << ", k " << k;
        }
}

TEST(StageSplit, UniformCostsGiveTheEvenSplitRemainderFirst) {
  const StageSplit s = balance_stages(std::vector<double>(10, 1.0), 4);
  EXPECT_EQ(s.layers, (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(s.first_layer(), (std::vector<int64_t>{0, 3, 6, 8}));
  EXPECT_EQ(s.costs, (std::vector<double>{3, 3, 2, 2}));
  EXPECT_DOUBLE_EQ(s.max_cost(), 3);
}

TEST(StageSplit, ExtrasShiftLayersAwayFromTheEnds) {
  // 12 unit layers, 4 chunks, a head worth 2 layers: the slowest chunk costs 4, so the
  // last chunk holds at most 2 layers. [4, 3, 3, 2] and [4, 4, 3, 1] both cost
  // {4, 3, 3, 4} in some order (equal squares); earlier chunks take more.
  const StageSplit s = balance_stages(std::vector<double>(12, 1.0), 4, 0, 2);
  EXPECT_EQ(s.layers, (std::vector<int64_t>{4, 4, 3, 1}));
  EXPECT_EQ(s.costs, (std::vector<double>{4, 4, 3, 3}));
  // An embedding as heavy as the whole model leaves chunk 0 with no layers.
  const StageSplit e = balance_stages(std::vector<double>(6, 1.0), 3, 10, 0);
  EXPECT_EQ(e.layers, (std::vector<int64_t>{0, 3, 3}));
  EXPECT_DOUBLE_EQ(e.max_cost(), 10);
}

TEST(StageSplit, MoreChunksThanLayersLeavesChunksEmpty) {
  const StageSplit s = balance_stages({1.0, 1.0}, 4);
  EXPECT_EQ(s.layers, (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_DOUBLE_EQ(s.max_cost(), 1);
  const StageSplit none = balance_stages({}, 3, 1, 2);
  EXPECT_EQ(none.layers, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(none.costs, (std::vector<double>{1, 0, 2}));
}

TEST(StageSplit, LayerCostsAreTheEstimatorsFlops) {
  for (const std::string name : {"llama3-70b", "deepseek-v3-like"}) {
    const ModelDesc m = model_preset(name);
    const LayerCosts c = layer_costs(m);
    ASSERT_EQ(int64_t(c.layers.size()), m.layers);
    const double sum = std::accumulate(c.layers.begin(), c.layers.end(), c.first_extra + c.last_extra);
    EXPECT_NEAR(sum, forward_flops_per_token(m), 1e-12 * sum) << name;
    EXPECT_EQ(c.first_extra, 0) << name;
    EXPECT_EQ(c.last_extra, head_forward_flops_per_token(m)) << name;
  }
  // DeepSeek's first 3 layers are dense: they cost otherwise than the MoE ones.
  const LayerCosts ds = layer_costs(model_preset("deepseek-v3-like"));
  EXPECT_EQ(ds.layers[0], ds.layers[2]);
  EXPECT_NE(ds.layers[2], ds.layers[3]);
  EXPECT_EQ(ds.layers[3], ds.layers.back());
}

TEST(StageSplit, ModelsMatchTheOptimum) {
  for (const ModelDesc& m : {llama_3m(), model_preset("llama3-70b")}) {
    const LayerCosts c = layer_costs(m);
    for (int64_t k : {2, 4, 8, 16}) {
      Problem p{c.layers, k, c.first_extra, c.last_extra};
      const StageSplit s = solve(p);
      expect_consistent(p, s);
      const double best = optimum(p);
      // Exact, which is stricter than the 5% the planner could live with.
      EXPECT_LE(s.max_cost(), 1.05 * best) << m.name << " k " << k;
      EXPECT_NEAR(s.max_cost(), best, 1e-12 * best) << m.name << " k " << k << ": " << describe(s);
      double even = 0;
      for (int64_t j = 0, i = 0; j < k; ++j) {
        const int64_t n = m.layers / k + (j < m.layers % k ? 1 : 0);
        even = std::max(even, chunk_cost(p, j, i, i + n));
        i += n;
      }
      std::printf("%-10s %2lld chunks: %-48s slowest %.4g GFLOP/token (optimum %.4g, even split %.4g)\n",
                  m.name.c_str(), static_cast<long long>(k), describe(s).c_str(), s.max_cost() / 1e9, best / 1e9,
                  even / 1e9);
    }
  }
}

TEST(StageSplit, ErrorsNameTheValue) {
  auto has = [](const std::string& what, const std::string& part) {
    EXPECT_NE(what.find(part), std::string::npos) << "'" << what << "' lacks '" << part << "'";
  };
  has(error_of([] { balance_stages({1, 2}, 0); }), "expected chunks >= 1, found 0");
  has(error_of([] { balance_stages({1, -2, 3}, 2); }), "layer 1, found -2");
  has(error_of([] { balance_stages({1, std::nan(""), 3}, 2); }), "layer 1, found nan");
  has(error_of([] { balance_stages({1}, 2, std::numeric_limits<double>::infinity()); }), "first_extra, found inf");
  has(error_of([] { balance_stages({1}, 2, 0, -1); }), "last_extra, found -1");
}
