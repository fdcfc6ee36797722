// Benchmarks time each candidate on every rank; what counts is the slowest rank.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "hp/comm/collectives.h"

// `t` holds `iters` rounds of `k` candidates' seconds on this rank, round-major. Returns
// each candidate's median over the rounds of the slowest rank's time (an all-reduce max
// over `g`: every rank must call it).
inline std::vector<double> slowest_rank_medians(const hp::comm::Group& g, const std::vector<double>& t, int iters,
                                                size_t k) {
  at::Tensor v = at::tensor(t, at::kDouble);
  hp::comm::all_reduce_(v, g, hp::ReduceOp::Max);
  std::vector<double> out;
  for (size_t which = 0; which < k; ++which) {
    std::vector<double> m;
    for (int i = 0; i < iters; ++i) m.push_back(v[i * k + which].item<double>());
    std::nth_element(m.begin(), m.begin() + iters / 2, m.end());
    out.push_back(m[iters / 2]);
  }
  return out;
}
