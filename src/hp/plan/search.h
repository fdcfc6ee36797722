// Strategy search: every dp·tp·pp·cp·ep factorization of the device count that the model
// allows, crossed with ZeRO stages 0-3, pipeline schedules (and virtual stages), micro-batch
// sizes and recompute levels (and, with cp, the fastest of its attention modes); keeps the
// fastest that fit in memory.
//
// Pruning, none of which drops a candidate that could rank:
//   - a mesh is skipped when even fully sharded weights, grads and optimizer states
//     overflow a device;
//   - recompute is tried none -> selective -> full and stops at the first that fits
//     (more recompute never makes a step faster);
//   - candidates whose memory does not fit skip the time estimate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/plan/estimator.h"

namespace hp::plan {

struct SearchOptions {
  int64_t devices = 0;           // 0: every device of the cluster
  int64_t global_batch = 2048;   // sequences per step, fixed so that step times compare
  int top = 10;
  std::vector<std::string> schedules = schedule_names();
  std::vector<int64_t> micro_batch_sizes = {1, 2, 4, 8};
  std::vector<int64_t> interleave = {2, 4};  // virtual stages tried with interleaved-1f1b
  std::vector<int64_t> zero_stages = {0, 1, 2, 3};
  std::vector<std::string> cp_modes = {"ring", "ulysses", "allgather_kv"};  // hybrid needs a degree: not searched
};

struct SearchResult {
  std::vector<Estimate> best;  // fitting, fastest first
  int64_t meshes = 0;          // dp·tp·pp·cp·ep factorizations the model allows
  int64_t candidates = 0;      // strategies resolved
  int64_t fitting = 0;         // of which fit in memory
  double seconds = 0;          // wall time of the search
};

SearchResult search(Estimator& est, const SearchOptions& options);

}  // namespace hp::plan
