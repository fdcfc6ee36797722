#include "hp/train/trainer.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "hp/base/error.h"
#include "hp/checkpoint.h"
#include "hp/comm/world.h"
#include "hp/optim/chained.h"
#include "hp/parallel.h"
#include "hp/plan/flops.h"
#include "hp/train/data.h"
#include "hp/train/monitor.h"
#include "hp/train/plan_bridge.h"
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

// Float32 matmul FLOP/s of this rank, measured once: the peak MFU is taken against.
double measure_peak_flops() {
  const int64_t n = 512;
  at::Tensor a = at::full({n, n}, 0.5), b = at::full({n, n}, 0.25), c = at::empty({n, n});
  at::mm_out(c, a, b);  // warm-up
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 4;
    for (int i = 0; i < reps; ++i) at::mm_out(c, a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n * reps / s);
  }
  return best;
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg, const std::function<void(const StepLog&)>& on_log) {
  TrainHooks hooks;
  hooks.on_log = on_log;
  return run_training(cfg, hooks);
}

TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks) {
  const auto& on_log = hooks.on_log;
  validate(cfg);
  if (cfg.train.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  Training t = build_training(cfg);
  nn::Module& model = *t.model;
  optim::Optimizer* opt = t.opt.get();
  DataLoader loader(encode(read_text(cfg.data.path)), cfg.train.seq, cfg.train.batch, t.data_rank, t.data_size,
                    cfg.train.seed);
  if (t.pipeline)
    loader.order_sequence(t.cp_sizes, cfg.mesh.cp_load_balance);
  else
    loader.shard_sequence(t.cp_rank, t.cp_sizes, cfg.mesh.cp_load_balance);

  TrainResult result;
  // Checkpoints hold the parameters, the optimizer state and the position (step, data, RNG).
  std::optional<checkpoint::Checkpointer> ckpt;
  const auto& cc = cfg.checkpoint;
  // Made afresh for each load and save: shards and optimizer state kept in files come in
  // for it as new tensors (and go out again at their next use, written if they changed).
  auto current_state = [&] {
    bring_in_offloaded(t);
    checkpoint::State state;
    state.add_module(model);
    state.add_optimizer(*opt, model.named_parameters());
    return state;
  };
  if (!cc.dir.empty()) {
    // The snapshot of an asynchronous save is copied beside the next forward and backward,
    // unless fully_shard's shards are in files: the next all-gather sends them out again.
    const bool defer = cc.async && t.offloaded.empty();
    ckpt.emplace(checkpoint::CheckpointOptions{cc.dir, cc.keep, cc.async, /*defer_snapshot=*/defer});
    if (cc.resume) {
      checkpoint::State state = current_state();
      if (ckpt->load_latest(state)) result.first_step = restore_position(state, *opt, loader);
    }
  }

  // MFU: the planner's model FLOPs (forward and twice as much backward) over the peak of
  // every rank.
  const double flops_per_token = 3 * plan::forward_flops_per_token(model_desc_of(cfg));
  const double peak = (cfg.train.peak_tflops > 0 ? cfg.train.peak_tflops * 1e12 : measure_peak_flops()) *
                      double(cfg.world_size());
  std::optional<MetricsWriter> metrics;
  if (!cfg.train.metrics_file.empty() && comm::current_world()->rank() == 0)
    metrics.emplace(cfg.train.metrics_file, /*append=*/result.first_step > 0);
  if (hooks.on_built) hooks.on_built(t);
  std::optional<Monitor> monitor;  // nothing at all when [monitor] is off
  if (cfg.monitor.enabled()) monitor.emplace(t, cfg, /*append=*/result.first_step > 0);

  auto since = std::chrono::steady_clock::now();
  int64_t steps_since = 0;
  double bubble_since = 0;
  for (int64_t step = result.first_step; step < cfg.train.steps; ++step) {
    const double lr = optim::warmup_cosine_lr(step, t.base_lr, cfg.train.warmup, cfg.train.steps);
    Batch b = loader.next();
    if (hooks.before_step) hooks.before_step(t, step);
    if (monitor) monitor->begin_step(step);
    // The snapshot of an asynchronous save is copied until the step below changes it.
    StepOutput out = train_step(t, cfg, b.inputs, b.targets, lr, [&] {
      if (monitor) monitor->after_backward();  // stops before a non-finite value reaches the parameters
      if (ckpt) ckpt->wait_for_snapshot();
    });
    const double norm = out.grad_norm;
    bubble_since += out.bubble;
    const double value = out.loss.item<double>();  // the same on every rank
    HP_CHECK(std::isfinite(value)) << "loss became " << value << " at step " << step;
    result.losses.push_back(value);
    if (monitor) monitor->end_step(value, norm);
    ++steps_since;
    const bool last = step + 1 == cfg.train.steps;
    if (ckpt && (last || (cc.every > 0 && (step + 1) % cc.every == 0))) {
      checkpoint::State state = current_state();
      record_position(state, step + 1, *opt, loader);
      ckpt->save(step + 1, state);
    }
    if ((on_log || metrics) && (step % cfg.train.log_every == 0 || last)) {
      StepLog log;
      log.step = step, log.loss = value, log.grad_norm = norm, log.lr = lr;
      log.ms_per_step =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count() / steps_since;
      log.tokens_per_s = double(cfg.train.batch * cfg.train.seq) / (log.ms_per_step / 1000.0);
      log.mfu = log.tokens_per_s * flops_per_token / peak;
      log.bubble = bubble_since / steps_since;
      log.rss_mib = resident_mib();
      log.expert_load = out.expert_load;
      if (on_log) on_log(log);
      if (metrics) metrics->write(log);
      since = std::chrono::steady_clock::now();
      steps_since = 0, bubble_since = 0;
    }
  }
  if (ckpt) ckpt->wait();
  return result;
}

}  // namespace hp::train
