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
#include "hp/train/train_step.h"

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
  Training t = build_training(cfg);
  nn::Module& model = *t.model;
  optim::Optimizer* opt = t.opt.get();
  DataLoader loader(encode(read_text(cfg.data.path)), cfg.train.seq, cfg.train.batch, t.data_rank, t.data_size,
                    cfg.train.seed);

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
    const double lr = optim::warmup_cosine_lr(step, t.base_lr, cfg.train.warmup, cfg.train.steps);
    Batch b = loader.next();
    // The snapshot of an asynchronous save is copied until the step below changes it.
    StepOutput out = train_step(t, cfg, b.inputs, b.targets, lr, [&] {
      if (ckpt) ckpt->wait_for_snapshot();
    });
    const double norm = out.grad_norm;
    const double value = out.loss.item<double>();  // the same on every rank
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
