// Benchmarks time each candidate on every rank; what counts is the slowest rank.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "hp/comm/collectives.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/symm.h"

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

// Median seconds per call of each candidate over `iters` rounds. Each round times `calls`
// back-to-back calls of every candidate in turn (as nccl-tests do), so all see the same
// machine and a lone scheduling hiccup is spread over the batch. Every rank starts each
// batch together and reports the slowest rank. The start is the shared-memory barrier when
// there is one: its ranks leave within microseconds of each other, where Gloo's leave up
// to ~100 us apart, which would count as latency.
inline std::vector<double> median_seconds(const hp::comm::Group& g, int iters, int calls,
                                          const std::vector<std::function<void()>>& ops) {
  const bool shm = hp::symm::shm_collectives_enabled(g);
  for (int i = 0; i < 3; ++i)  // warm-up: connections, segments, the heap settling
    for (const auto& op : ops) op();
  const size_t k = ops.size();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    for (const auto& op : ops) {
      if (shm) {
        // Twice: a rank that waited long in the first (for a slow peer) may have gone to
        // sleep and leave it late; the second finds every rank awake.
        hp::symm::barrier(g);
        hp::symm::barrier(g);
      } else {
        hp::comm::barrier(g);
      }
      auto s = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) op();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count() / calls);
    }
  }
  return slowest_rank_medians(g, t, iters, k);
}
