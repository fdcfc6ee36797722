// hp trace FILE... [--svg OUT] [--from MS] [--to MS]: the timelines HP_TRACE wrote
// (<prefix>.<rank>.json per process), summarised per rank (how much of the progress
// engine's communication ran behind compute) or drawn.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>

#include "commands.h"
#include "hp/base/error.h"
#include "hp/schedule/render.h"
#include "hp/train/trace_svg.h"

namespace hp::cli {
namespace {

struct TraceArgs {
  std::vector<std::string> files;
  std::string svg;
  double from_ms = 0, to_ms = std::numeric_limits<double>::infinity();
};

void run_trace(const TraceArgs& a) {
  std::vector<train::TraceSpan> spans;
  for (const std::string& f : a.files) {
    std::ifstream in(f);
    HP_CHECK(in) << "hp trace: cannot read " << f;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (train::TraceSpan& s : train::read_chrome_trace(text)) spans.push_back(std::move(s));
  }
  HP_CHECK(!spans.empty()) << "hp trace: no spans in the given files";
  if (!a.svg.empty()) {
    schedule::write_text_file(a.svg, train::plot_trace_svg(spans, a.from_ms, a.to_ms));
    std::printf("wrote %s (%zu spans)\n", a.svg.c_str(), spans.size());
  }
  for (const train::TraceOverlap& o : train::trace_overlap(spans))
    std::printf("rank %d: engine communication %.1f ms, %.0f%% of it behind compute; caller waited %.1f ms\n", o.rank,
                o.engine_ms, 100 * o.hidden_share(), o.wait_ms);
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto args = std::make_shared<TraceArgs>();
  auto* cmd = app.add_subcommand("trace", "summarise or draw the timelines HP_TRACE wrote (Chrome trace JSON)");
  cmd->add_option("files", args->files, "the trace files, one per process (<HP_TRACE>.<rank>.json)")->required();
  cmd->add_option("--svg", args->svg, "draw the spans, a row per rank and lane, to this SVG file");
  cmd->add_option("--from", args->from_ms, "draw from this many ms after the first span");
  cmd->add_option("--to", args->to_ms, "draw up to this many ms after the first span");
  cmd->callback([args] { run_trace(*args); });
}

}  // namespace hp::cli
