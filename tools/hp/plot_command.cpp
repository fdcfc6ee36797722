// hp plot METRICS.jsonl [--svg OUT.svg]: the metrics file of `hp train`, drawn or summarised.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "hp/base/error.h"
#include "hp/schedule/render.h"
#include "hp/train/metrics.h"

namespace hp::cli {
namespace {

struct PlotArgs {
  std::string metrics, svg;
};

// Steps, first and last loss, mean tokens/s: enough to tell whether a run learned.
void print_summary(const std::string& path, const std::vector<train::MetricsRecord>& all) {
  const std::vector<train::MetricsRecord> records = train::last_record_per_step(all);
  std::printf("%s: %zu steps logged, %lld to %lld", path.c_str(), records.size(),
              static_cast<long long>(records.front().step), static_cast<long long>(records.back().step));
  if (all.size() > records.size())
    std::printf(" (%zu lines repeat a step after a restart)", all.size() - records.size());
  double tokens_per_s = 0;
  for (const train::MetricsRecord& r : records) tokens_per_s += r.tokens_per_s;
  std::printf("\nloss %.4f -> %.4f\nmean %.0f tokens/s\n", records.front().loss, records.back().loss,
              tokens_per_s / static_cast<double>(records.size()));
}

void run_plot(const PlotArgs& a) {
  const std::vector<train::MetricsRecord> records = train::read_metrics(a.metrics);
  HP_CHECK(!records.empty()) << a.metrics << " holds no metrics records";
  if (a.svg.empty()) {
    print_summary(a.metrics, records);
    return;
  }
  schedule::write_text_file(a.svg, train::plot_metrics_svg(records));
  std::printf("wrote %s (%zu steps)\n", a.svg.c_str(), train::last_record_per_step(records).size());
}

}  // namespace

void add_plot_command(CLI::App& app) {
  auto args = std::make_shared<PlotArgs>();
  auto* cmd = app.add_subcommand("plot", "plot or summarise the metrics file of hp train (JSON lines)");
  cmd->add_option("metrics", args->metrics, "the metrics file, one JSON object per logged step")->required();
  cmd->add_option("--svg", args->svg, "write loss, tokens/s and grad norm against step to this SVG file");
  cmd->callback([args] { run_plot(*args); });
}

}  // namespace hp::cli
