// The precision monitor of the trainer ([monitor] in the config): why a distributed run
// drifts from a single-device one, and where it went wrong when it does.
//   every = N                per-module activation and output-gradient norms on steps
//                            0, N, 2N, ...; a non-finite one stops training at its module
//   spike_factor = F         a loss or grad norm above F times the median of the last 20
//                            steps is warned about and logged
//   replica_check_every = N  after every N-th update, replicated parameters compared
//                            across ranks (replica_check.h)
// Rank 0 writes the lines of monitor_log.h to `file`. Every part is off at 0.
#pragma once

#include <cstdint>
#include <optional>

#include "hp/train/config.h"
#include "hp/train/module_norms.h"
#include "hp/train/monitor_log.h"
#include "hp/train/spike_detector.h"
#include "hp/train/train_step.h"

namespace hp::train {

class Monitor {
 public:
  // Hooks into t.model when monitor.every > 0; rank 0 opens monitor.file (appending when
  // `append`: a resumed run).
  Monitor(Training& t, const TrainConfig& cfg, bool append);

  // Before the step's forward: arms the norms on monitored steps.
  void begin_step(int64_t step);
  // Between backward and the optimizer, on every rank: stops at the first non-finite module.
  void after_backward();
  // After the update, with the step's loss and gradient norm (measured when
  // train.grad_clip > 0): spikes, the replica check, the step's lines.
  void end_step(double loss, double grad_norm);

 private:
  void check_replicas();  // every rank of every stage, stopping all of them on a mismatch

  Training& t_;
  MonitorConfig cfg_;
  bool grad_norm_known_;
  bool lead_;  // rank 0 warns and writes
  int64_t step_ = 0;
  bool monitored_ = false;
  std::optional<ModuleNormRecorder> norms_;
  std::vector<ModuleNorm> last_norms_;
  SpikeDetector loss_spikes_, grad_norm_spikes_;
  std::optional<MonitorWriter> out_;
};

}  // namespace hp::train
