// hp schedule: generate, validate, simulate and draw a pipeline schedule; with --split,
// show how a model's layers divide into its stages' chunks.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

#include "commands.h"
#include "hp/base/error.h"
#include "hp/plan/model_desc.h"
#include "hp/plan/stage_split.h"
#include "hp/schedule.h"

namespace hp::cli {

namespace {

struct ScheduleArgs {
  std::string kind = "1f1b";
  int ranks = 4;
  int microbatches = 8;
  int virtual_stages = 0;
  double f = 1, b = 2, w = 1, i = -1, latency = 0;
  int send_capacity = schedule::kUnboundedSends;
  bool comm = false;
  std::string svg, trace, save;
  bool split = false;
  int64_t layers = 0;
  std::string model;
};

void run_schedule(const ScheduleArgs& a) {
  namespace hs = hp::schedule;
  const hs::Schedule s = hs::make_schedule(a.kind, a.ranks, a.microbatches, a.virtual_stages);
  hs::CostModel costs;
  costs.uniform = {a.f, a.b, a.i >= 0 ? a.i : a.b - a.w, a.w};
  costs.latency = a.latency;
  costs.send_capacity = a.send_capacity;
  const hs::SimResult sim = hs::simulate(s, costs);

  std::cout << s.name << ": " << s.num_ranks << " ranks, " << s.num_stages << " stages, "
            << s.num_microbatches << " microbatches\n"
            << s.to_string(a.comm);
  std::printf("makespan %.6g  bubble %.4f (%.1f%%)\n", sim.makespan, sim.bubble_ratio,
              100 * sim.bubble_ratio);
  std::cout << "peak in-flight per rank:";
  for (int v : sim.peak_in_flight) std::cout << ' ' << v;
  std::cout << '\n';
  if (!a.svg.empty()) hs::write_text_file(a.svg, hs::render_svg(s, sim));
  if (!a.trace.empty()) hs::write_text_file(a.trace, hs::render_chrome_trace(s, sim));
  if (!a.save.empty()) hs::write_text_file(a.save, hs::to_json(s));
}

// One line per chunk: where the schedule runs it, its layers and its cost.
void run_split(const ScheduleArgs& a) {
  HP_CHECK(a.layers > 0 || !a.model.empty()) << "hp schedule --split: expected --layers N or --model, found neither";
  // The schedule says how many chunks its kind has and which rank runs each.
  const schedule::Schedule s = schedule::make_schedule(a.kind, a.ranks, a.microbatches, a.virtual_stages);
  plan::LayerCosts costs;
  double unit = 1;  // printed costs are in units of this
  if (a.model.empty()) {
    costs.layers.assign(static_cast<size_t>(a.layers), 1.0);
    std::printf("%lld layers of cost 1", static_cast<long long>(a.layers));
  } else {
    const plan::ModelDesc m = plan::load_model(a.model);
    costs = plan::layer_costs(m);
    unit = 1e9;
    std::printf("%s: %lld layers, cost in forward GFLOP per token (the head adds %.4g to the last chunk),",
                m.name.c_str(), static_cast<long long>(m.layers), costs.last_extra / unit);
  }
  std::printf(" into %d chunks, %s on %d ranks\n", s.num_stages, s.name.c_str(), s.num_ranks);

  // The same costs and call as the planner's split_stages, so the two agree.
  const plan::StageSplit split =
      plan::balance_stages(costs.layers, s.num_stages, costs.first_extra, costs.last_extra);
  const std::vector<int64_t> first = split.first_layer();
  const double slowest = split.max_cost();
  double total = 0;
  std::printf("chunk  rank  first  layers        cost   share\n");
  for (int c = 0; c < s.num_stages; ++c) {
    std::printf("%5d  %4d  %5lld  %6lld  %10.4g  %5.1f%%\n", c, s.rank_of(c), static_cast<long long>(first[c]),
                static_cast<long long>(split.layers[c]), split.costs[c] / unit,
                slowest > 0 ? 100 * split.costs[c] / slowest : 100.0);
    total += split.costs[c];
  }
  const double mean = total / s.num_stages;
  std::printf("slowest %.4g, mean %.4g, max/mean %.4f\n", slowest / unit, mean / unit,
              mean > 0 ? slowest / mean : 1.0);
}

}  // namespace

void add_schedule_command(CLI::App& app) {
  auto args = std::make_shared<ScheduleArgs>();
  auto* cmd = app.add_subcommand("schedule", "generate, check, simulate and draw a pipeline schedule");
  std::string kinds;
  for (const auto& k : schedule::schedule_kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  cmd->add_option("--kind", args->kind, "schedule: " + kinds)->capture_default_str();
  cmd->add_option("--stages", args->ranks, "pipeline ranks (physical stages)")->capture_default_str();
  cmd->add_option("--microbatches", args->microbatches, "microbatches per step")->capture_default_str();
  cmd->add_option("--virtual", args->virtual_stages, "stages per rank (interleaved-1f1b; default 2)");
  cmd->add_option("--f", args->f, "forward cost per stage")->capture_default_str();
  cmd->add_option("--b", args->b, "full backward cost per stage")->capture_default_str();
  cmd->add_option("--w", args->w, "weight-grad cost per stage (split backward)")->capture_default_str();
  cmd->add_option("--i", args->i, "input-grad cost per stage (default b - w)");
  cmd->add_option("--latency", args->latency, "point-to-point latency")->capture_default_str();
  cmd->add_option("--send-capacity", args->send_capacity,
                  "unreceived sends per peer before a send blocks (-1 unbounded, 0 rendezvous)")
      ->capture_default_str();
  cmd->add_flag("--comm", args->comm, "print SEND/RECV actions too");
  cmd->add_option("--svg", args->svg, "write an SVG timeline");
  cmd->add_option("--trace", args->trace, "write a Chrome trace (open in Perfetto)");
  cmd->add_option("--save", args->save, "write the schedule as JSON");
  auto* split = cmd->add_flag("--split", args->split,
                              "instead of the schedule, print the cost-balanced split of layers into its chunks");
  auto* layers = cmd->add_option("--layers", args->layers, "layers to split, each of cost 1 (with --split)")
                     ->check(CLI::PositiveNumber)
                     ->needs(split);
  cmd->add_option("--model", args->model, "model preset or TOML file to split by layer FLOPs (with --split)")
      ->needs(split)
      ->excludes(layers);
  cmd->callback([args] { args->split ? run_split(*args) : run_schedule(*args); });
}

}  // namespace hp::cli
