// The trainer's setup and per-step work, shared by `hp train` and the real dry-run
// (`hp dryrun --real`), which runs them on a fake world and meta tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hp/optim/optimizer.h"
#include "hp/parallel.h"
#include "hp/pipeline/runtime.h"
#include "hp/train/config.h"

namespace hp::train {

// A model parallelised by the recipe, its optimizer, and where the batch goes.
struct Training {
  Training(DeviceMesh m, DeviceMesh stage) : mesh(std::move(m)), stage_mesh(std::move(stage)) {}
  DeviceMesh mesh;        // the config's mesh
  DeviceMesh stage_mesh;  // the mesh the model lives on: `mesh` without its pp dim
  std::shared_ptr<nn::Llama> llama;     // the whole model (pp = 1), dense
  std::shared_ptr<nn::MoELlama> moe_llama;  // the whole model (pp = 1) with [moe]
  std::shared_ptr<nn::Module> model;    // this rank's parameters, named as in the whole Llama
  std::unique_ptr<pipeline::PipelineRuntime> pipeline;  // pp > 1: this rank's stages
  std::vector<std::unique_ptr<DistributedDataParallel>> ddp;  // one per stage (or the whole model)
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<DTensor*> params;
  const comm::Group* other_stages = nullptr;  // pp > 1: the ranks holding the other stages' parameters
  // pp > 1 with [moe]: the auxiliary losses this rank's stages computed in the step, each
  // times 1 / microbatches (their gradient rides on the stage outputs: nn::carry_aux_loss).
  std::shared_ptr<at::Tensor> stage_aux_loss;
  std::map<std::string, int> chunk_of;        // pp > 1: the top-level modules of this rank's chunks, and their chunk
  std::vector<Placement> rows;  // the batch's layout on `stage_mesh`: rows over dp and ep, the same on every other dim
  std::vector<int64_t> global;  // [batch, seq] of the whole step
  int64_t data_rank = 0, data_size = 1;  // which rows of the global batch this rank reads (DataLoader)
  // Which share of every sequence it reads (DataLoader::shard_sequence): its rank over the
  // cp mesh dims (outer major) and their sizes, outer first.
  int64_t cp_rank = 0;
  std::vector<int64_t> cp_sizes{1};
  double base_lr = 0;
  // [memory] fsdp_offload_dir: the root units whose shards are in files (one per chunk of a
  // pipeline rank).
  std::vector<FSDPModule> offloaded;
  std::shared_ptr<memory::OffloadedParameters> offloaded_parameters;  // theirs, as one view
};

// Brings every offloaded shard and gradient of `t` in, for a reader between steps (a
// checkpoint, the replica check); each goes out again at its unit's next use.
void bring_in_offloaded(Training& t);

// Mesh, model (tensor parallel over "tp", experts over "ep", then ddp or fully_shard over
// "dp" as the config says, in pipeline stages over "pp") and optimizer on the current world. `device`: the
// mesh's ("meta" for a dry-run).
Training build_training(const TrainConfig& cfg, const std::string& device = "cpu");

struct StepOutput {
  at::Tensor loss;  // 0-dim, the same on every rank
  double grad_norm = 0;
  double expert_load = 0;  // MoE: the largest max / mean expert load of the step's MoE blocks
  double bubble = 0;  // pp > 1: this rank's idle share of the pipeline step
};

// One step on this rank's rows (int64 [batch / dp, seq], or the whole batch with pp > 1):
// forward, backward, clipping, `before_update`, the optimizer step at `lr`, zero_grad.
StepOutput train_step(Training& t, const TrainConfig& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                      double lr, const std::function<void()>& before_update = {});

// How a batch lies on a stage mesh: rows over dp and ep, sequence over cp, the rest
// replicated; activations between blocks with sequence parallelism also have their
// sequence over tp.
std::vector<Placement> batch_placements(const DeviceMesh& stage_mesh, bool sequence_sharded = false);

namespace detail {
// The MoE Llama of [moe] on `mesh`: tensor parallel over "tp", experts over "ep", [low_precision].
std::shared_ptr<nn::MoELlama> build_moe_llama(const TrainConfig& cfg, const DeviceMesh& mesh);
// Pipeline stages over "pp" (pipeline_training.cpp): fills t.model, t.pipeline, t.ddp.
void build_pipeline(Training& t, const TrainConfig& cfg);
// [low_precision]: FP8 on the block Linears of `model` (tensor-parallel or not); nothing when off.
void apply_precision(nn::Module& model, const TrainConfig& cfg);
// [mesh] context_parallel: the style on every block's attention over the cp dims; nothing without cp.
void apply_context_parallel(nn::Llama& model, const DeviceMesh& stage_mesh, const TrainConfig& cfg);
// The stage mesh dims DDP reduces gradients over: dp, ep with [moe] (DDP skips the experts
// there) and cp's; none for "replicate".
std::vector<std::string> gradient_reduce_dims(const TrainConfig& cfg);
// fully_shard's shards go to files ([memory] fsdp_offload_dir; a dry-run's meta tensors have
// no bytes to offload): its policy for `mesh`, or none.
OffloadPolicyVariant shard_offload_policy(const TrainConfig& cfg, const DeviceMesh& mesh);
// `shard` (fully_shard over `model` and its parts, with `o`), then each rank draws its
// shards of the deferred parameters, never the whole model; a shard offloaded to a file goes
// there as fully_shard makes it, so with offloading the values are drawn before. The unit
// `shard` returns joins t.offloaded where it offloads.
FSDPModule shard_and_draw(Training& t, nn::Module& model, const FullyShardOptions& o,
                          const std::function<FSDPModule()>& shard);
// The mesh fully_shard takes: dp, as (cp, dp) HSDP when cp is one dim.
DeviceMesh fully_shard_mesh(const DeviceMesh& stage_mesh, const TrainConfig& cfg);
// fully_shard's meshes for the MoE Llama (torchtitan's dp_shard_in_ep): the parameters
// outside the experts over every rank that reads its own rows (dp and ep flattened), the
// experts, already split over ep, over dp (one rank when the mesh has no dp dim).
std::pair<DeviceMesh, DeviceMesh> moe_shard_meshes(const DeviceMesh& stage_mesh);
// [memory]'s activation checkpointing, after tensor parallelism and before data parallelism.
void apply_activation_checkpointing(nn::Module& model, const TrainConfig& cfg);
}  // namespace detail

}  // namespace hp::train
