// Drawing a simulated schedule: an SVG timeline and a Chrome trace (Perfetto).
#pragma once

#include <string>

#include "hp/schedule/action.h"
#include "hp/schedule/simulate.h"

namespace hp::schedule {

struct SvgOptions {
  double px_per_unit = 40;  // horizontal scale: pixels per unit of simulated time
  double row_height = 28;
  bool labels = true;       // "stage.mb" inside each box
};

// One row per rank, one colored box per compute action (F blue, B green,
// I teal, W orange), a legend and a time axis.
std::string render_svg(const Schedule& s, const SimResult& sim, const SvgOptions& opt = {});

// Chrome trace JSON: {"traceEvents": [...]} with one complete ("ph": "X") event
// per action; pid = rank, tid 0 for compute and 1 for transfers (receives show
// their wait). ts/dur are in microseconds, `us_per_unit` per unit of time.
std::string render_chrome_trace(const Schedule& s, const SimResult& sim,
                                double us_per_unit = 1000.0);

// Writes `text` to `path`, throwing hp::Error naming the path on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace hp::schedule
