// The training loop behind `hp train`: mesh, model, parallel recipe, optimizer and data,
// all from a TrainConfig.
#pragma once

#include <functional>
#include <vector>

#include "hp/train/config.h"
#include "hp/train/metrics.h"

namespace hp::train {

// A log line: the mean over the steps since the previous one (ms_per_step, tokens_per_s of
// the whole job, mfu, bubble), the step's loss, grad norm and lr, this rank's resident memory.
using StepLog = MetricsRecord;

struct Training;  // train_step.h

// Calls into the loop, for tools that watch a run and tests that break one on purpose.
struct TrainHooks {
  std::function<void(const StepLog&)> on_log;  // as run_training's on_log
  // Once the model is parallelised, before the monitor adds its hooks (so a forward hook
  // added here runs before the monitor's and the monitor sees what it did).
  std::function<void(Training&)> on_built;
  std::function<void(Training&, int64_t step)> before_step;  // before the step's forward
};

struct TrainResult {
  int64_t first_step = 0;      // > 0 when resumed from a checkpoint
  std::vector<double> losses;  // every step from first_step on
};

// Runs `cfg` on the current world (init_distributed() or a thread rank); calls `on_log`
// every cfg.train.log_every steps and at the last step, on every rank; rank 0 also writes
// the log to cfg.train.metrics_file when set (appending when resumed). With
// cfg.checkpoint.dir set it saves there and, unless cfg.checkpoint.resume is false,
// resumes from the latest checkpoint found there.
// With cfg.monitor enabled, the precision monitor (monitor.h) watches every step.
TrainResult run_training(const TrainConfig& cfg, const std::function<void(const StepLog&)>& on_log = {});
TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks);

}  // namespace hp::train
