#include "hp/train/dry_run.h"

#include <ATen/ATen.h>

#include <chrono>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/fake_backend.h"
#include "hp/optim/adamw.h"
#include "hp/tensor/memory_stats.h"
#include "hp/train/train_step.h"

namespace hp::train {

DryRunResult dry_run(const TrainConfig& cfg, int rank, int64_t steps) {
  validate(cfg);
  const int64_t world = cfg.world_size();
  HP_CHECK(rank >= 0 && rank < world) << "dry-run: rank " << rank << " is outside the mesh "
                                      << to_string_list(cfg.mesh.shape) << " of " << world << " ranks (0.."
                                      << world - 1 << ")";
  HP_CHECK(steps >= 1) << "dry-run: needs at least one step, got " << steps;
  HP_CHECK(cfg.dims().cp == 1) << "dry-run: context parallelism (the cp mesh dim, " << cfg.dims().cp
                               << ") does not run on meta tensors yet; the planner's estimate covers it";
  const auto start = std::chrono::steady_clock::now();

  track_meta_memory();
  auto fake = comm::fake_world(rank, static_cast<int>(world));
  comm::ScopedWorld scope(fake);
  const int64_t before = meta_memory_allocated();

  DryRunResult r;
  r.rank = rank;
  r.world = world;
  r.steps = steps;
  {
    Training t = build_training(cfg, "meta");
    r.setup_bytes = meta_memory_allocated() - before;
    r.setup_collectives = static_cast<int64_t>(fake->collective_log().records().size());
    reset_meta_memory_peak();
    const auto local = at::TensorOptions().device(at::kMeta).dtype(at::kLong);
    const int64_t rows = cfg.train.batch / t.data_size;
    for (int64_t s = 0; s < steps; ++s) {
      at::Tensor inputs = at::empty({rows, cfg.train.seq}, local), targets = at::empty({rows, cfg.train.seq}, local);
      train_step(t, cfg, inputs, targets, optim::warmup_cosine_lr(s, t.base_lr, cfg.train.warmup, cfg.train.steps));
    }
    r.peak_bytes = meta_memory_peak() - before;
  }
  r.collectives = fake->collective_log().records();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace hp::train
