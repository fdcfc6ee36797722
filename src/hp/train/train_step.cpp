#include "hp/train/train_step.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/comm/collectives.h"
#include "hp/optim/adamw.h"
#include "hp/optim/chained.h"

namespace hp::train {
namespace {

int find_dim(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int>(it - names.begin());
}

// The dims the model lives on: the config's without pp (a size-1 dp when nothing is left).
DeviceMesh stage_mesh_of(const DeviceMesh& mesh) {
  std::vector<std::string> dims;
  for (const auto& n : mesh.dim_names())
    if (n != "pp") dims.push_back(n);
  return mesh.submesh(dims);
}

void build_whole_model(Training& t, const TrainConfig& cfg) {
  DeviceMesh& mesh = t.stage_mesh;
  t.llama = std::make_shared<nn::Llama>(cfg.model, mesh);
  nn::Llama& model = *t.llama;
  if (cfg.mesh_size("tp") > 1) parallelize_llama(model, mesh["tp"], {cfg.mesh.sequence_parallel, /*loss_parallel=*/true});
  // Data parallelism from outside the model, after tensor parallelism.
  if (cfg.mesh_size("dp") > 1 && cfg.mesh.data_parallel == "ddp")
    t.ddp.push_back(std::make_unique<DistributedDataParallel>(model, mesh["dp"]));
  if (cfg.mesh_size("dp") > 1 && cfg.mesh.data_parallel == "fsdp") fully_shard_llama(model, mesh["dp"]);
  t.model = t.llama;
}

}  // namespace

Training build_training(const TrainConfig& cfg, const std::string& device) {
  validate(cfg);
  std::vector<int64_t> shape = cfg.mesh.shape;
  std::vector<std::string> names = cfg.mesh.names;
  if (cfg.mesh_size("pp") > 1 && names.size() == 1) shape.push_back(1), names.push_back("dp");
  DeviceMesh mesh = init_device_mesh(device, shape, names);
  Training t{mesh, stage_mesh_of(mesh)};

  manual_seed(cfg.train.seed);
  if (cfg.mesh_size("pp") > 1)
    detail::build_pipeline(t, cfg);
  else
    build_whole_model(t, cfg);
  t.params = t.model->parameters();
  const optim::AdamWOptions adamw{.lr = cfg.train.lr, .weight_decay = cfg.train.weight_decay};
  if (cfg.train.optimizer == "muon")
    t.opt = std::make_unique<optim::ChainedOptimizer>(optim::get_hyper_optimizer(
        *t.model, optim::MuonOptions{.lr = cfg.train.muon_lr, .weight_decay = cfg.train.weight_decay}, adamw));
  else
    t.opt = std::make_unique<optim::AdamW>(t.params, adamw);
  t.base_lr = t.opt->lr();

  const int dp_dim = find_dim(t.stage_mesh.dim_names(), "dp");
  t.rows.assign(t.stage_mesh.ndim(), Replicate());
  if (dp_dim >= 0) t.rows[dp_dim] = Shard(0);
  t.global = {cfg.train.batch, cfg.train.seq};
  // A pipeline's first and last stages take the whole batch and split it into microbatches
  // whose rows then go over dp (mesh_stage); without one each dp rank reads its own rows.
  if (!t.pipeline && dp_dim >= 0) t.data_rank = t.stage_mesh.local_rank(dp_dim), t.data_size = t.stage_mesh.size(dp_dim);
  return t;
}

StepOutput train_step(Training& t, const TrainConfig& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                      double lr, const std::function<void()>& before_update) {
  t.opt->set_lr(lr);
  StepOutput out;
  if (t.pipeline) {
    out.loss = t.pipeline->step(inputs, targets);
    out.bubble = t.pipeline->last_stats().idle_fraction();
  } else {
    DTensor ids = DTensor::from_local(inputs, t.stage_mesh, t.rows, t.global);
    DTensor tgt = DTensor::from_local(targets, t.stage_mesh, t.rows, t.global);
    DTensor loss = t.llama->loss(ids, tgt);
    loss.to_local().backward();
    out.loss = loss.to_local();
  }
  if (cfg.train.grad_clip > 0) out.grad_norm = optim::clip_grad_norm_(t.params, cfg.train.grad_clip, t.other_stages);
  if (before_update) before_update();
  t.opt->step();
  t.opt->zero_grad();
  return out;
}

}  // namespace hp::train
