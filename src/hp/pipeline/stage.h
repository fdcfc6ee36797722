// One pipeline stage of a model: a forward function and the parameters it uses.
// Model-agnostic on purpose: any callable that maps the stage input to its output.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hp/comm/group.h"
#include "hp/tensor/weight_outputs.h"
#include "hp/topology/mesh_shape.h"

namespace hp::pipeline {

using ForwardFn = std::function<at::Tensor(const at::Tensor& input)>;
// (output of the last stage, target microbatch) -> scalar loss of that microbatch.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

struct PipelineStage {
  int stage_index = 0;
  int num_stages = 1;
  ForwardFn forward;
  std::vector<at::Tensor> parameters;  // leaves with requires_grad; grads accumulate in .grad
  LossFn loss;                         // the last stage only
  std::shared_ptr<const comm::Group> group;  // every rank of every stage
  // MPMD: the stage runs on every rank of `mesh` (global ranks), each executing the same
  // actions; activations travel between stages whole (see mesh_stage.h). Unset: one rank.
  std::optional<MeshShape> mesh;
  // This rank's part of the input gradient (input-shaped) to the whole input gradient: a
  // collective on the stage mesh. Unset: the identity (one rank per stage).
  std::function<at::Tensor(const at::Tensor& input_grad)> gather_input_grad;
  // With meshes: activations and their gradients travel as each rank's piece, to and from
  // the rank at the same place of the neighbouring stage's mesh (of the same shape), not
  // whole from each mesh's first rank. Every stage of a runtime says the same.
  bool pieces = false;
  // Called before each backward that accumulates parameter gradients (B, or W of a split
  // one) with whether it is this stage's last in the step: a data-parallel wrapper inside
  // the stage then reduces gradients once.
  std::function<void(bool last)> set_requires_gradient_sync;
  // The wrapper reduces as the parameters' gradients accumulate (DDP's hooks), so a split
  // backward's W can be the last; fully_shard's reduction runs in B only, and a schedule
  // that splits backwards is refused for it.
  bool sync_in_weight_backward = false;

  bool is_first() const { return stage_index == 0; }
  bool is_last() const { return stage_index == num_stages - 1; }
  // Throws hp::Error naming the stage unless the fields are consistent.
  void check() const;
};

// Sets every parameter's .grad to undefined (the next backward starts from zero).
void zero_grad(const PipelineStage& stage);

namespace detail {

// The autograd work of one (stage, microbatch), kept between its F and its B or I + W.
struct StageWork {
  at::Tensor input;        // a leaf; requires grad unless this is the first stage
  at::Tensor output;       // what F produced (the next stage's input)
  at::Tensor loss;         // last stage: the scaled microbatch loss
  at::Tensor grad_output;  // from the next stage (not for the last stage)
  at::Tensor input_grad;   // what B or I produced, for the previous stage
  // A split backward: what F recorded (weight_outputs.h) and the gradients I took of it.
  std::vector<WeightOutput> weight_outputs;
  std::vector<at::Tensor> weight_output_grads;
};

// F: runs the stage on `input` (detached into a fresh leaf so each stage has its own
// graph); on the last stage also the loss, times `loss_scale`. `split`: its backward will
// be I then W, so the outputs of parameter-owning ops are recorded for W.
StageWork run_forward(const PipelineStage& st, const at::Tensor& input, const at::Tensor& target,
                      double loss_scale, bool split = false);
// B: full backward; grads accumulate into the parameters, w.input_grad is set (not stage 0).
void run_backward(const PipelineStage& st, StageWork& w);
// I: the input grad and the recorded outputs' grads (every activation-gradient product
// once, no weight-gradient product), keeping the graph for W.
void run_backward_input(const PipelineStage& st, StageWork& w);
// W: the parameter grads, accumulated into .grad: from each recorded output to its own
// parameters, then from the stage output to any parameter no record covers (repeating
// the activation-gradient work on their path). `last`: the stage's last W in the step;
// set_requires_gradient_sync(true) goes before its final backward only.
void run_backward_weight(const PipelineStage& st, StageWork& w, bool last = false);

}  // namespace detail
}  // namespace hp::pipeline
