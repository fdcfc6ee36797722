#include "hp/train/trainer.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "hp/base/error.h"
#include "hp/checkpoint.h"
#include "hp/optim/chained.h"
#include "hp/parallel.h"
#include "hp/train/data.h"

namespace hp::train {
namespace {

double resident_mib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return double(resident) * double(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

int find_dim(const std::vector<std::string>& names, const std::string& name) {
  auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int>(it - names.begin());
}

// Where the run stands, beside the tensors of a checkpoint.
void record_position(checkpoint::State& state, int64_t step, const optim::Optimizer& opt, const DataLoader& loader) {
  const RngState rng = get_rng_state();
  state.scalars = {{"step", step},
                   {"optim.steps", opt.steps()},
                   {"data.position", loader.position()},
                   {"rng.seed", static_cast<int64_t>(rng.seed)},  // bits kept as they are
                   {"rng.offset", static_cast<int64_t>(rng.offset)}};
}

int64_t restore_position(const checkpoint::State& state, optim::Optimizer& opt, DataLoader& loader) {
  auto get = [&](const char* key) {
    auto it = state.scalars.find(key);
    HP_CHECK(it != state.scalars.end()) << "checkpoint has no scalar " << key << " (not saved by the trainer?)";
    return it->second;
  };
  opt.set_steps(get("optim.steps"));
  loader.seek(get("data.position"));
  set_rng_state({static_cast<uint64_t>(get("rng.seed")), static_cast<uint64_t>(get("rng.offset"))});
  return get("step");
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg, const std::function<void(const StepLog&)>& on_log) {
  validate(cfg);
  if (cfg.train.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  DeviceMesh mesh = init_device_mesh("cpu", cfg.mesh.shape, cfg.mesh.names);
  const int dp_dim = find_dim(cfg.mesh.names, "dp"), tp_dim = find_dim(cfg.mesh.names, "tp");

  manual_seed(cfg.train.seed);
  nn::Llama model(cfg.model, mesh);
  if (tp_dim >= 0 && mesh.size(tp_dim) > 1)
    parallelize_llama(model, mesh["tp"], {cfg.mesh.sequence_parallel, /*loss_parallel=*/true});
  // Data parallelism from outside the model, after tensor parallelism.
  std::unique_ptr<DistributedDataParallel> ddp;
  const bool dp_parallel = dp_dim >= 0 && mesh.size(dp_dim) > 1;
  if (dp_parallel && cfg.mesh.data_parallel == "ddp") ddp = std::make_unique<DistributedDataParallel>(model, mesh["dp"]);
  if (dp_parallel && cfg.mesh.data_parallel == "fsdp") fully_shard_llama(model, mesh["dp"]);
  auto params = model.parameters();
  const optim::AdamWOptions adamw{.lr = cfg.train.lr, .weight_decay = cfg.train.weight_decay};
  std::unique_ptr<optim::Optimizer> opt;
  if (cfg.train.optimizer == "muon")
    opt = std::make_unique<optim::ChainedOptimizer>(optim::get_hyper_optimizer(
        model, optim::MuonOptions{.lr = cfg.train.muon_lr, .weight_decay = cfg.train.weight_decay}, adamw));
  else
    opt = std::make_unique<optim::AdamW>(params, adamw);
  const double base_lr = opt->lr();

  const int64_t dp_rank = dp_dim >= 0 ? mesh.local_rank(dp_dim) : 0;
  const int64_t dp_size = dp_dim >= 0 ? mesh.size(dp_dim) : 1;
  DataLoader loader(encode(read_text(cfg.data.path)), cfg.train.seq, cfg.train.batch, dp_rank, dp_size,
                    cfg.train.seed);
  // Batches: rows over data parallel, the same on every other mesh dim.
  std::vector<Placement> rows(mesh.ndim(), Replicate());
  if (dp_dim >= 0) rows[dp_dim] = Shard(0);
  const std::vector<int64_t> global{cfg.train.batch, cfg.train.seq};

  TrainResult result;
  // Checkpoints hold the parameters, the optimizer state and the position (step, data, RNG).
  std::optional<checkpoint::Checkpointer> ckpt;
  checkpoint::State state;
  const auto& cc = cfg.checkpoint;
  if (!cc.dir.empty()) {
    // The snapshot of an asynchronous save is copied beside the next forward and backward.
    ckpt.emplace(checkpoint::CheckpointOptions{cc.dir, cc.keep, cc.async, /*defer_snapshot=*/cc.async});
    state.add_module(model);
    state.add_optimizer(*opt, model.named_parameters());
    if (cc.resume && ckpt->load_latest(state)) result.first_step = restore_position(state, *opt, loader);
  }

  auto since = std::chrono::steady_clock::now();
  int64_t steps_since = 0;
  for (int64_t step = result.first_step; step < cfg.train.steps; ++step) {
    const double lr = optim::warmup_cosine_lr(step, base_lr, cfg.train.warmup, cfg.train.steps);
    opt->set_lr(lr);
    Batch b = loader.next();
    DTensor ids = DTensor::from_local(b.inputs, mesh, rows, global);
    DTensor targets = DTensor::from_local(b.targets, mesh, rows, global);
    DTensor loss = model.loss(ids, targets);
    loss.to_local().backward();
    const double norm = cfg.train.grad_clip > 0 ? optim::clip_grad_norm_(params, cfg.train.grad_clip) : 0;
    if (ckpt) ckpt->wait_for_snapshot();  // the step below changes what the last save copies
    opt->step();
    opt->zero_grad();
    const double value = loss.to_local().item<double>();  // Replicate: the same on every rank
    HP_CHECK(std::isfinite(value)) << "loss became " << value << " at step " << step;
    result.losses.push_back(value);
    ++steps_since;
    const bool last = step + 1 == cfg.train.steps;
    if (ckpt && (last || (cc.every > 0 && (step + 1) % cc.every == 0))) {
      record_position(state, step + 1, *opt, loader);
      ckpt->save(step + 1, state);
    }
    if (on_log && (step % cfg.train.log_every == 0 || last)) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count() / steps_since;
      on_log(StepLog{step, value, norm, lr, ms, double(cfg.train.batch * cfg.train.seq) / (ms / 1000.0),
                     resident_mib()});
      since = std::chrono::steady_clock::now();
      steps_since = 0;
    }
  }
  if (ckpt) ckpt->wait();
  return result;
}

}  // namespace hp::train
