#include "hp/plan/stage_split.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hp/base/error.h"
#include "hp/plan/flops.h"

namespace hp::plan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_cost(const char* what, int64_t index, double v) {
  HP_CHECK(std::isfinite(v) && v >= 0) << "balance_stages: expected a finite cost >= 0 for " << what
                                       << (index >= 0 ? " " + std::to_string(index) : std::string()) << ", found "
                                       << v;
}

// The cost of chunk j holding layers [i, e), read from prefix sums.
class ChunkCost {
 public:
  ChunkCost(const std::vector<double>& costs, int64_t chunks, double first_extra, double last_extra)
      : chunks_(chunks), first_(first_extra), last_(last_extra), prefix_(costs.size() + 1, 0.0) {
    for (size_t l = 0; l < costs.size(); ++l) prefix_[l + 1] = prefix_[l] + costs[l];
  }
  double operator()(int64_t j, int64_t i, int64_t e) const {
    return prefix_[e] - prefix_[i] + (j == 0 ? first_ : 0) + (j == chunks_ - 1 ? last_ : 0);
  }

 private:
  int64_t chunks_;
  double first_, last_;
  std::vector<double> prefix_;
};

}  // namespace

double StageSplit::max_cost() const { return costs.empty() ? 0 : *std::max_element(costs.begin(), costs.end()); }

std::vector<int64_t> StageSplit::first_layer() const {
  std::vector<int64_t> first(layers.size(), 0);
  for (size_t c = 1; c < layers.size(); ++c) first[c] = first[c - 1] + layers[c - 1];
  return first;
}

StageSplit balance_stages(const std::vector<double>& layer_costs, int64_t chunks, double first_extra,
                          double last_extra) {
  HP_CHECK(chunks >= 1) << "balance_stages: expected chunks >= 1, found " << chunks;
  for (size_t l = 0; l < layer_costs.size(); ++l) check_cost("layer", int64_t(l), layer_costs[l]);
  check_cost("first_extra", -1, first_extra);
  check_cost("last_extra", -1, last_extra);

  const int64_t n = static_cast<int64_t>(layer_costs.size()), k = chunks;
  const ChunkCost cost(layer_costs, k, first_extra, last_extra);
  auto at = [n](int64_t j, int64_t i) { return static_cast<size_t>(j * (n + 1) + i); };

  // Pass 1. slowest[j][i]: the smallest slowest-chunk cost of layers [i, n) in chunks
  // j..k-1. Along e, chunk j's cost grows and the rest's optimum shrinks, so the scan
  // stops where they cross. Chunk 0 always starts at layer 0.
  std::vector<double> slowest(static_cast<size_t>(k * (n + 1)), kInf);
  for (int64_t i = 0; i <= n; ++i) slowest[at(k - 1, i)] = cost(k - 1, i, n);
  for (int64_t j = k - 2; j >= 0; --j) {
    for (int64_t i = j == 0 ? 0 : n; i >= 0; --i) {
      double best = kInf;
      for (int64_t e = i; e <= n; ++e) {
        const double here = cost(j, i, e), rest = slowest[at(j + 1, e)];
        best = std::min(best, std::max(here, rest));
        if (here >= rest) break;
      }
      slowest[at(j, i)] = best;
    }
  }
  const double limit = slowest[at(0, 0)];

  // Pass 2. spread[j][i]: the smallest sum of squared chunk costs (relative to `limit`)
  // of layers [i, n) in chunks j..k-1 with no chunk above `limit`.
  const double scale = limit > 0 ? limit : 1;
  auto square = [scale](double c) { return (c / scale) * (c / scale); };
  std::vector<double> spread(static_cast<size_t>(k * (n + 1)), kInf);
  for (int64_t i = 0; i <= n; ++i)
    if (cost(k - 1, i, n) <= limit) spread[at(k - 1, i)] = square(cost(k - 1, i, n));
  for (int64_t j = k - 2; j >= 0; --j) {
    for (int64_t i = j == 0 ? 0 : n; i >= 0; --i) {
      double best = kInf;
      for (int64_t e = i; e <= n && cost(j, i, e) <= limit; ++e)
        best = std::min(best, square(cost(j, i, e)) + spread[at(j + 1, e)]);
      spread[at(j, i)] = best;
    }
  }

  // Walk forward; among (near-)equal choices the latest end gives the earlier chunk more layers.
  StageSplit split;
  int64_t i = 0;
  for (int64_t j = 0; j < k; ++j) {
    int64_t end = j == k - 1 ? n : i;
    if (j < k - 1) {
      const double target = spread[at(j, i)];
      const double tolerance = 1e-12 * target;
      for (int64_t e = i; e <= n && cost(j, i, e) <= limit; ++e)
        if (square(cost(j, i, e)) + spread[at(j + 1, e)] <= target + tolerance) end = e;
    }
    double c = (j == 0 ? first_extra : 0) + (j == k - 1 ? last_extra : 0);
    for (int64_t l = i; l < end; ++l) c += layer_costs[static_cast<size_t>(l)];
    split.layers.push_back(end - i);
    split.costs.push_back(c);
    i = end;
  }
  return split;
}

LayerCosts layer_costs(const ModelDesc& m) {
  LayerCosts c;
  const double dense = layer_forward_flops_per_token(m, false), moe = layer_forward_flops_per_token(m, true);
  for (int64_t l = 0; l < m.layers; ++l) c.layers.push_back(m.layer_is_moe(l) ? moe : dense);
  c.first_extra = 0;
  c.last_extra = head_forward_flops_per_token(m);
  return c;
}

StageSplit balance_stages(const ModelDesc& m, int64_t chunks) {
  const LayerCosts c = layer_costs(m);
  return balance_stages(c.layers, chunks, c.first_extra, c.last_extra);
}

}  // namespace hp::plan
