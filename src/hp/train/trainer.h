// The training loop behind `hp train`: mesh, model, parallel recipe, optimizer and data,
// all from a TrainConfig.
#pragma once

#include <functional>
#include <vector>

#include "hp/train/config.h"

namespace hp::train {

struct StepLog {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double ms_per_step = 0;    // mean over the steps since the last log line
  double tokens_per_s = 0;   // global tokens
  double rss_mib = 0;        // resident memory of this rank
};

struct TrainResult {
  int64_t first_step = 0;      // > 0 when resumed from a checkpoint
  std::vector<double> losses;  // every step from first_step on
};

// Runs `cfg` on the current world (init_distributed() or a thread rank); calls `on_log`
// every cfg.train.log_every steps and at the last step, on every rank. With
// cfg.checkpoint.dir set it saves there and, unless cfg.checkpoint.resume is false,
// resumes from the latest checkpoint found there.
TrainResult run_training(const TrainConfig& cfg, const std::function<void(const StepLog&)>& on_log = {});

}  // namespace hp::train
