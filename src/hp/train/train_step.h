// The trainer's setup and per-step work, shared by `hp train` and the real dry-run
// (`hp dryrun --real`), which runs them on a fake world and meta tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hp/optim/optimizer.h"
#include "hp/parallel.h"
#include "hp/train/config.h"

namespace hp::train {

// A model parallelised by the recipe, its optimizer, and where the batch goes.
struct Training {
  DeviceMesh mesh;
  std::unique_ptr<nn::Llama> model;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<DTensor*> params;
  std::vector<Placement> rows;  // the batch's layout: rows over dp, the same on every other dim
  std::vector<int64_t> global;  // [batch, seq] of the whole step
  int64_t dp_rank = 0, dp_size = 1;
  double base_lr = 0;
};

// Mesh, model (tensor parallel over "tp", then ddp or fully_shard over "dp" as the config
// says) and optimizer on the current world. `device`: the mesh's ("meta" for a dry-run).
Training build_training(const TrainConfig& cfg, const std::string& device = "cpu");

struct StepOutput {
  DTensor loss;  // Replicate
  double grad_norm = 0;
};

// One step on this rank's rows (int64 [batch / dp, seq]): forward, backward, clipping,
// `before_update`, the optimizer step at `lr`, zero_grad.
StepOutput train_step(Training& t, const TrainConfig& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                      double lr, const std::function<void()>& before_update = {});

}  // namespace hp::train
