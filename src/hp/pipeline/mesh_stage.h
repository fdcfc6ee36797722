// A pipeline stage on a sub-mesh (MPMD): the stage's model code works on DTensors over
// its own DeviceMesh (tensor parallel, fully_shard, data parallel inside), while the
// pipeline moves plain tensors between stages (runtime.h says why).
//
// Each rank of the mesh takes its piece of the whole input as the stage declares it
// (`input_placements`, no communication), runs the model, and hands on the whole output
// (DTensor::full_tensor, differentiable, so the output grad comes back into the stage's
// own layout). The input grad is gathered whole on every rank of the mesh before it goes
// back to the previous stage. The last stage's loss stays a DTensor until it is a
// replicated scalar, so a vocabulary-sharded loss (loss parallel) needs no gather.
//
// Between stages on meshes of the same shape (`output_placements` set, the next stage's
// input placements) nothing is gathered: the output is laid out as the next stage takes
// it and each rank hands on its own piece, to the rank at the same place of the next
// mesh, which takes it as its piece of the input; the input grad goes back the same way.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "hp/pipeline/stage.h"
#include "hp/tensor/dtensor.h"

namespace hp::pipeline {

using DTensorForwardFn = std::function<DTensor(const DTensor& input)>;
// (stage output, whole target microbatch) -> the microbatch loss, Replicate on every mesh dim.
using DTensorLossFn = std::function<DTensor(const DTensor& output, const at::Tensor& target)>;

struct MeshStageOptions {
  int stage_index = 0;
  int num_stages = 1;
  std::vector<Placement> input_placements;  // one per mesh dim; Shard or Replicate
  // Pieces between stages (above): the layout the next stage takes its input in, and the
  // whole activation's shape (every stage's input but the first's, and output but the
  // last's). Unset: whole activations.
  std::vector<Placement> output_placements;
  std::vector<int64_t> activation_shape;
  DTensorForwardFn forward;
  std::vector<DTensor*> parameters;  // e.g. module.parameters(); their local tensors get the grads
  DTensorLossFn loss;                // the last stage only
  std::shared_ptr<const comm::Group> group;  // every rank of every stage
  // A data-parallel wrapper inside the stage: gradients are reduced in the step's last
  // backward only (PipelineStage says when, and what sync_in_weight_backward means).
  std::function<void(bool)> set_requires_gradient_sync;
  bool sync_in_weight_backward = false;
};

// The stage on `mesh` (this rank must be in it). Throws hp::Error on bad placements.
PipelineStage mesh_stage(const DeviceMesh& mesh, MeshStageOptions options);

// This rank's piece of `whole` laid out as `spec` (differentiable narrows, no copy).
at::Tensor local_piece(const at::Tensor& whole, const ShardSpec& spec, const std::vector<int64_t>& coord);

}  // namespace hp::pipeline
