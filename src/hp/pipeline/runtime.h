// Executes any validated schedule from hp::schedule on this rank's stages.
//
// The runtime never asks which schedule it runs: it walks this rank's action list.
//   F      runs the stage forward (stage 0 on the input microbatch, later stages on
//          the activation received or handed over locally, as a leaf with grad)
//   B      full backward (from the loss on the last stage, else from the output grad)
//   I / W  split backward: input grad first (graph kept), weight grads later
//   SEND_* non-blocking sends, all waited before step() returns
//   RECV_* receives posted early (activation headers at step start, grads right
//          after the F they belong to) and waited just before use
// Adjacent stages on one rank (the turn of a V) hand tensors over without comm.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "hp/pipeline/stage.h"
#include "hp/schedule/action.h"

namespace hp::pipeline {

// Time spent in one kind of compute action during a step (seconds).
struct PhaseTime {
  double seconds = 0;
  int count = 0;
  double mean() const { return count ? seconds / count : 0.0; }
};

// Where the time of one step went on this rank (seconds).
struct StepStats {
  double wall = 0;      // step() from entry to return
  double compute = 0;   // inside F, B, I, W
  PhaseTime f, b, i, w; // per kind: the unit costs as they were in the step
  double idle_fraction() const { return wall > 0 ? 1.0 - compute / wall : 0.0; }
};

class PipelineRuntime {
 public:
  // `stages`: this rank's stages (any order), all sharing one group whose size is the
  // schedule's rank count; the group rank is the schedule rank. An unlowered schedule
  // is lowered here. Throws hp::Error if the schedule is invalid or does not fit.
  PipelineRuntime(std::vector<PipelineStage> stages, schedule::Schedule schedule);

  // Splits `inputs` and `targets` on dim 0 into num_microbatches() equal pieces and runs
  // one step. Only the first stage's rank reads `inputs` and only the last stage's rank
  // reads `targets`; other ranks may pass undefined tensors. Returns the loss, the mean
  // of the microbatch losses, on every pipeline rank (a 0-dim double tensor).
  at::Tensor step(const at::Tensor& inputs, const at::Tensor& targets);
  // The same with the microbatches given one by one (their shapes may differ).
  at::Tensor step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets);

  int num_microbatches() const { return schedule_.num_microbatches; }
  const schedule::Schedule& schedule() const { return schedule_; }
  const std::vector<PipelineStage>& stages() const { return stages_; }
  const StepStats& last_stats() const { return stats_; }

 private:
  std::vector<PipelineStage> stages_;
  schedule::Schedule schedule_;
  std::shared_ptr<const comm::Group> group_;
  int rank_ = 0;
  StepStats stats_;
};

}  // namespace hp::pipeline
