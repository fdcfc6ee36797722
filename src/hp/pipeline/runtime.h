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
//
// MPMD: a schedule rank may stand for several ranks (a stage mesh, `rank_meshes`), all of
// which execute that schedule rank's actions. Activations and their grads cross from one
// mesh to the next whole: the first rank of the sending mesh (its leader) sends the whole
// tensor to every rank of the receiving mesh, which takes its piece locally (mesh_stage.h).
// Whole tensors because that is correct for any pair of meshes and layouts, uneven shards
// included, with no planning; the price is a gather on the sending mesh and the whole
// activation per receiver. Between meshes of one shape whose stages say `pieces`, each
// rank sends its own piece to the rank at its place instead (hp train's stages).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
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
  double compute = 0;   // inside F, B, I, W, less their waits for an activation or a gradient
  PhaseTime f, b, i, w; // per kind: the unit costs as they were in the step
  double idle_fraction() const { return wall > 0 ? 1.0 - compute / wall : 0.0; }
};

// An empty tensor shaped like the activation stage `stage` sends for microbatch `mb`.
using ActivationBufferFn = std::function<at::Tensor(int stage, int microbatch)>;

class PipelineRuntime {
 public:
  // `stages`: this rank's stages (any order), all sharing one group whose size is the
  // schedule's rank count; the group rank is the schedule rank. An unlowered schedule
  // is lowered here. Throws hp::Error if the schedule is invalid or does not fit.
  PipelineRuntime(std::vector<PipelineStage> stages, schedule::Schedule schedule);
  // MPMD: schedule rank r runs on the global ranks of rank_meshes[r]; together they are
  // exactly the ranks of the stages' group. A stage with a mesh must be on its rank's mesh.
  PipelineRuntime(std::vector<PipelineStage> stages, schedule::Schedule schedule,
                  std::vector<MeshShape> rank_meshes);

  // Splits `inputs` and `targets` on dim 0 into num_microbatches() equal pieces and runs
  // one step. Only the first stage's ranks read `inputs` and only the last stage's ranks
  // read `targets` (whole, on each of them); other ranks may pass undefined tensors. Returns the loss, the mean
  // of the microbatch losses, on every pipeline rank (a 0-dim double tensor).
  at::Tensor step(const at::Tensor& inputs, const at::Tensor& targets);
  // The same with the microbatches given one by one (their shapes may differ).
  at::Tensor step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets);

  // Static shapes: activations travel without the header that tells the receiver their
  // shape (one message fewer each), received into buffers from `fn` posted at step start.
  // Needed on a fake world (a dry-run), whose receives deliver nothing to decode.
  void set_static_shapes(ActivationBufferFn fn) { activation_buffer_ = std::move(fn); }

  int num_microbatches() const { return schedule_.num_microbatches; }
  const schedule::Schedule& schedule() const { return schedule_; }
  const std::vector<PipelineStage>& stages() const { return stages_; }
  const StepStats& last_stats() const { return stats_; }

 private:
  std::vector<PipelineStage> stages_;
  schedule::Schedule schedule_;
  std::shared_ptr<const comm::Group> group_;
  std::vector<std::vector<int>> members_;  // per schedule rank: its group ranks, leader first
  int rank_ = 0;                           // this rank's schedule rank
  ActivationBufferFn activation_buffer_;   // set: static shapes
  StepStats stats_;
};

}  // namespace hp::pipeline
