#include "hp/train/train_step.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/optim/adamw.h"
#include "hp/optim/chained.h"

namespace hp::train {
namespace {

int find_dim(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int>(it - names.begin());
}

}  // namespace

Training build_training(const TrainConfig& cfg, const std::string& device) {
  validate(cfg);
  Training t{init_device_mesh(device, cfg.mesh.shape, cfg.mesh.names), nullptr, nullptr, nullptr, {}, {}, {}};
  DeviceMesh& mesh = t.mesh;
  const int dp_dim = find_dim(cfg.mesh.names, "dp"), tp_dim = find_dim(cfg.mesh.names, "tp");

  manual_seed(cfg.train.seed);
  t.model = std::make_unique<nn::Llama>(cfg.model, mesh);
  nn::Llama& model = *t.model;
  if (tp_dim >= 0 && mesh.size(tp_dim) > 1)
    parallelize_llama(model, mesh["tp"], {cfg.mesh.sequence_parallel, /*loss_parallel=*/true});
  // Data parallelism from outside the model, after tensor parallelism.
  const bool dp_parallel = dp_dim >= 0 && mesh.size(dp_dim) > 1;
  if (dp_parallel && cfg.mesh.data_parallel == "ddp")
    t.ddp = std::make_unique<DistributedDataParallel>(model, mesh["dp"]);
  if (dp_parallel && cfg.mesh.data_parallel == "fsdp") fully_shard_llama(model, mesh["dp"]);
  t.params = model.parameters();
  const optim::AdamWOptions adamw{.lr = cfg.train.lr, .weight_decay = cfg.train.weight_decay};
  if (cfg.train.optimizer == "muon")
    t.opt = std::make_unique<optim::ChainedOptimizer>(optim::get_hyper_optimizer(
        model, optim::MuonOptions{.lr = cfg.train.muon_lr, .weight_decay = cfg.train.weight_decay}, adamw));
  else
    t.opt = std::make_unique<optim::AdamW>(t.params, adamw);
  t.base_lr = t.opt->lr();

  t.dp_rank = dp_dim >= 0 ? mesh.local_rank(dp_dim) : 0;
  t.dp_size = dp_dim >= 0 ? mesh.size(dp_dim) : 1;
  t.rows.assign(mesh.ndim(), Replicate());
  if (dp_dim >= 0) t.rows[dp_dim] = Shard(0);
  t.global = {cfg.train.batch, cfg.train.seq};
  return t;
}

StepOutput train_step(Training& t, const TrainConfig& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                      double lr, const std::function<void()>& before_update) {
  t.opt->set_lr(lr);
  DTensor ids = DTensor::from_local(inputs, t.mesh, t.rows, t.global);
  DTensor tgt = DTensor::from_local(targets, t.mesh, t.rows, t.global);
  DTensor loss = t.model->loss(ids, tgt);
  loss.to_local().backward();
  const double norm = cfg.train.grad_clip > 0 ? optim::clip_grad_norm_(t.params, cfg.train.grad_clip) : 0;
  if (before_update) before_update();
  t.opt->step();
  t.opt->zero_grad();
  return {loss, norm};
}

}  // namespace hp::train
