// hp schedule: generate, validate, simulate and draw a pipeline schedule.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
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
  cmd->callback([args] { run_schedule(*args); });
}

}  // namespace hp::cli
