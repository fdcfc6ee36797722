// hp train --config FILE.toml: the training job (run it under hprun for several ranks).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "hp/base/strings.h"
#include "hp/comm/world.h"
#include "hp/train.h"

namespace hp::cli {
namespace {

// HP_FAULT_KILL=RANK:STEP: rank RANK kills itself with SIGKILL after step STEP on the
// first attempt (HP_RESTART_COUNT unset or 0). For recovery tests under hprun.
void maybe_kill_self(int rank, int64_t step) {
  static const char* spec = std::getenv("HP_FAULT_KILL");
  if (!spec) return;
  const char* restarts = std::getenv("HP_RESTART_COUNT");
  long r = -1, s = -1;
  if ((restarts && std::atoi(restarts) != 0) || std::sscanf(spec, "%ld:%ld", &r, &s) != 2) return;
  if (r == rank && s == step) std::raise(SIGKILL);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a Llama model (defaults for everything; see configs/)");
  auto path = std::make_shared<std::string>();
  cmd->add_option("--config", *path, "TOML file: [mesh], [model], [train], [data]");
  cmd->callback([path] {
    train::TrainConfig cfg = path->empty() ? train::default_config() : train::load_config(*path);
    auto world = comm::init_distributed();
    HP_CHECK(world->size() == cfg.world_size())
        << "the mesh " << to_string_list(cfg.mesh.shape) << " needs " << cfg.world_size() << " ranks but "
        << world->size() << " were started (hprun --nproc-per-node " << cfg.world_size() << ")";
    const bool lead = world->rank() == 0;
    if (lead) std::cout << "# " << cfg.source << "\n" << cfg.to_string() << std::flush;
    auto result = train::run_training(cfg, [&](const train::StepLog& s) {
      maybe_kill_self(world->rank(), s.step);
      if (!lead) return;
      std::printf("step %5lld  loss %7.4f  grad %6.3f  lr %.2e  %8.0f tok/s  mfu %5.1f%%", static_cast<long long>(s.step),
                  s.loss, s.grad_norm, s.lr, s.tokens_per_s, 100 * s.mfu);
      if (cfg.dims().pp > 1) std::printf("  bubble %4.1f%%", 100 * s.bubble);
      if (cfg.moe.enabled()) std::printf("  load %4.2f", s.expert_load);
      std::printf("  %7.1f ms/step  %6.0f MiB\n", s.ms_per_step, s.rss_mib);
      std::fflush(stdout);
    });
    if (lead && !result.losses.empty())
      std::printf("done: loss %.4f -> %.4f over %zu steps%s\n", result.losses.front(), result.losses.back(),
                  result.losses.size(),
                  result.first_step ? (" (resumed at step " + std::to_string(result.first_step) + ")").c_str() : "");
  });
}

}  // namespace hp::cli
