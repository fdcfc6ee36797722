// `hp dryrun` and `hp plan`: estimate one strategy, or search for the best ones.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hp/base/error.h"
#include "hp/plan.h"
#ifdef HP_WITH_TRAIN
#include "hp/train/plan_bridge.h"
#endif

namespace hp::cli {

namespace {

struct PlanArgs {
  std::string model, topology, strategy;
  int64_t devices = 0;
  int64_t global_batch = 2048;
  int top = 10;
  bool json = false;
  bool real = false;  // run the trainer on a fake world and meta tensors
  int rank = 0;
  int64_t steps = 1;
  std::string emit_config;  // write a training config for the strategy
};

#ifdef HP_WITH_TRAIN
// Writes the trainer's config for `s`; the caller scales steps and sizes to its machine.
void emit_config(const plan::ModelDesc& m, const plan::Strategy& s, const std::string& path) {
  const train::TrainConfig cfg = train::config_of(m, s);
  train::validate(cfg);
  std::ofstream out(path);
  HP_CHECK(out) << "cannot write " << path;
  out << cfg.to_string();
  HP_CHECK(out.flush()) << "cannot write " << path;
  std::cout << "wrote " << path << ": hp train --config " << path << " on " << cfg.world_size() << " ranks ("
            << plan::to_string(s) << ")\n";
}

// The first of the search's strategies, fastest first, that the trainer runs.
const plan::Strategy& first_trainable(const plan::SearchResult& r, const plan::ModelDesc& m) {
  HP_CHECK(!r.best.empty()) << "plan --emit-config: no strategy fits";
  std::string why;
  for (const plan::Estimate& e : r.best) {
    try {
      train::validate(train::config_of(m, e.strategy));
      return e.strategy;
    } catch (const Error& err) {
      if (why.empty()) why = err.what();
    }
  }
  HP_FAIL() << "plan --emit-config: none of the " << r.best.size() << " strategies shown is run by the trainer; the "
            << "fastest: " << why;
  return r.best.front().strategy;
}
#endif

void require_train(const PlanArgs& a) {
#ifndef HP_WITH_TRAIN
  HP_CHECK(a.emit_config.empty()) << "--emit-config needs hp built with LibTorch (HP_WITH_TORCH=ON)";
#else
  (void)a;
#endif
}

}  // namespace

void add_plan_commands(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();

  auto* dry = app.add_subcommand("dryrun", "estimate memory, communication and step time of one strategy");
  dry->add_option("--model", args->model, "model preset or TOML file")->required();
  dry->add_option("--topology", args->topology, "topology preset or TOML file (with --real: default cluster-16k)");
  dry->add_option("--strategy", args->strategy, "e.g. \"dp=8,tp=8,pp=6,mb=16,zero=3,recompute=full,schedule=1f1b\"")
      ->required();
  dry->add_option("--devices", args->devices, "devices to use (default: all of the topology)");
  dry->add_flag("--json", args->json, "print JSON");
  dry->add_flag("--real", args->real,
                "run the trainer's real steps as one rank, on a fake process group and meta tensors "
                "(dp, tp, pp and zero; world = --devices)");
  dry->add_option("--rank", args->rank, "with --real: the rank to run")->capture_default_str();
  dry->add_option("--steps", args->steps, "with --real: training steps to run")->capture_default_str();
  dry->add_option("--emit-config", args->emit_config, "write a training config for the strategy (hp train --config)");
  dry->callback([args] {
    HP_CHECK(!args->topology.empty() || args->real) << "dryrun: --topology is required (unless --real)";
    plan::ModelDesc m = plan::load_model(args->model);
    plan::ClusterSpec c = plan::load_cluster(args->topology.empty() ? "cluster-16k" : args->topology);
    const int64_t n = args->devices > 0 ? args->devices : c.num_devices();
    if (args->real) {
#ifdef HP_WITH_TRAIN
      run_real_dryrun(m, c, plan::parse_strategy(args->strategy), n, args->rank, args->steps, args->json);
      return;
#else
      HP_FAIL() << "dryrun --real needs hp built with LibTorch (HP_WITH_TORCH=ON)";
#endif
    }
    plan::Strategy s = plan::resolve_strategy(plan::parse_strategy(args->strategy), m, n);
    require_train(*args);
#ifdef HP_WITH_TRAIN
    if (!args->emit_config.empty()) emit_config(m, s, args->emit_config);
#endif
    plan::Estimator est(m, c);
    plan::Estimate e = est.estimate(s);
    std::cout << (args->json ? plan::dryrun_json(e, m, c) : plan::format_dryrun(e, m, c));
  });

  auto* pl = app.add_subcommand("plan", "search dp/tp/pp/cp/ep, ZeRO stage, schedule and recompute for the fastest fit");
  pl->add_option("--model", args->model, "model preset or TOML file")->required();
  pl->add_option("--topology", args->topology, "topology preset or TOML file")->required();
  pl->add_option("--devices", args->devices, "devices to use (default: all of the topology)");
  pl->add_option("--global-batch", args->global_batch, "sequences per step")->capture_default_str();
  pl->add_option("--top", args->top, "how many strategies to show")->capture_default_str();
  pl->add_flag("--json", args->json, "print JSON");
  pl->add_option("--emit-config", args->emit_config,
                 "write a training config for the fastest strategy the trainer runs (hp train --config)");
  pl->callback([args] {
    plan::ModelDesc m = plan::load_model(args->model);
    plan::ClusterSpec c = plan::load_cluster(args->topology);
    plan::SearchOptions o;
    o.devices = args->devices > 0 ? args->devices : c.num_devices();
    o.global_batch = args->global_batch;
    o.top = args->top;
    plan::Estimator est(m, c);
    plan::SearchResult r = plan::search(est, o);
    std::cout << (args->json ? plan::plan_json(r, m, c, o.devices) : plan::format_plan(r, m, c, o.devices));
    require_train(*args);
#ifdef HP_WITH_TRAIN
    if (!args->emit_config.empty()) emit_config(m, first_trainable(r, m), args->emit_config);
#endif
  });
}

}  // namespace hp::cli
