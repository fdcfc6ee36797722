// hp monitor plot FILE [--svg OUT] and hp diff A B [--rtol R]: the precision monitor's
// file of `hp train` ([monitor]) drawn, summarised, or compared with another run's.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <set>

#include "commands.h"
#include "hp/base/error.h"
#include "hp/schedule/render.h"
#include "hp/train/monitor_log.h"
#include "hp/train/monitor_svg.h"

namespace hp::cli {
namespace {

struct PlotArgs {
  std::string file, svg;
};

// Steps and modules monitored, spikes listed: whether the run saw trouble.
void print_summary(const std::string& path, const std::vector<train::MonitorRecord>& all) {
  std::set<int64_t> steps;
  std::set<std::string> modules;
  for (const train::MonitorRecord& r : train::latest_norms(all)) {
    steps.insert(r.step);
    if (r.is_module()) modules.insert(r.module);
  }
  std::printf("%s: %zu steps monitored, %zu modules\n", path.c_str(), steps.size(), modules.size());
  for (const train::MonitorRecord& r : all)
    if (r.is_event())
      std::printf("step %lld: %s, %g against a median of %g\n", static_cast<long long>(r.step), r.event.c_str(),
                  r.value, r.median);
}

void run_plot(const PlotArgs& a) {
  const std::vector<train::MonitorRecord> records = train::read_monitor_log(a.file);
  HP_CHECK(!records.empty()) << a.file << " holds no monitor records";
  if (a.svg.empty()) {
    print_summary(a.file, records);
    return;
  }
  schedule::write_text_file(a.svg, train::plot_monitor_svg(records));
  std::printf("wrote %s\n", a.svg.c_str());
}

struct DiffArgs {
  std::string a, b;
  double rtol = 1e-5;
};

// Prints the first divergence (exit status 1) or that there is none (0), as diff does.
void run_diff(const DiffArgs& d) {
  const auto a = train::read_monitor_log(d.a), b = train::read_monitor_log(d.b);
  const train::LogComparison c = train::compare_monitor_logs(a, b, d.rtol);
  HP_CHECK(c.lines_compared > 0) << d.a << " and " << d.b << " have no step in common";
  if (!c.first) {
    std::printf("no divergence over %lld steps (%lld lines) at rtol %g\n", static_cast<long long>(c.steps_compared),
                static_cast<long long>(c.lines_compared), d.rtol);
    return;
  }
  const train::Divergence& v = *c.first;
  const double rel = std::abs(v.a - v.b) / std::max(std::abs(v.a), std::abs(v.b));
  const std::string where = v.module.empty() ? "" : " in " + v.module;  // "": the step's own line
  std::printf("first divergence at step %lld%s: %s %.9g vs %.9g (relative difference %.3g > rtol %g)\n",
              static_cast<long long>(v.step), where.c_str(), v.metric.c_str(), v.a, v.b, rel, d.rtol);
  throw CLI::RuntimeError(1);  // no message: the exit status says "differ"
}

}  // namespace

void add_monitor_commands(CLI::App& app) {
  auto* monitor = app.add_subcommand("monitor", "the precision monitor's file of hp train ([monitor] file)");
  monitor->require_subcommand(1);
  auto plot = std::make_shared<PlotArgs>();
  auto* cmd = monitor->add_subcommand("plot", "plot or summarise per-module norms, loss and spikes");
  cmd->add_option("file", plot->file, "the monitor file, one JSON object per line")->required();
  cmd->add_option("--svg", plot->svg, "write loss and per-module norms against step to this SVG file");
  cmd->callback([plot] { run_plot(*plot); });

  auto diff = std::make_shared<DiffArgs>();
  auto* d = app.add_subcommand("diff", "the first step and module where two monitor files differ");
  d->add_option("a", diff->a, "the first run's monitor file")->required();
  d->add_option("b", diff->b, "the second run's monitor file")->required();
  d->add_option("--rtol", diff->rtol, "relative tolerance (default 1e-5)");
  d->callback([diff] { run_diff(*diff); });
}

}  // namespace hp::cli
