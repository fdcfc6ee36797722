// `hp trace`: the files HP_TRACE writes (comm/trace.h) read back, summarised and drawn as
// SVG: a row per rank and lane (caller, engine), spans as bars coloured by category
// (compute, comm, wait). Torch-free.
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace hp::train {

struct TraceSpan {
  std::string name, category;
  int rank = 0, lane = 0;  // lane 0: the caller, 1: the progress engine
  double begin_ms = 0, duration_ms = 0;
  double end_ms() const { return begin_ms + duration_ms; }
};

// The complete ("X") events of a Chrome trace-event file's text.
std::vector<TraceSpan> read_chrome_trace(const std::string& json_text);

// Per rank, how much of the engine's communication the caller hid: the share of the time
// the engine ran a collective while the caller was inside a compute span and neither
// waiting on a collective nor running one itself.
struct TraceOverlap {
  int rank = 0;
  double engine_ms = 0, hidden_ms = 0, wait_ms = 0;
  double hidden_share() const { return engine_ms > 0 ? hidden_ms / engine_ms : 0; }
};
std::vector<TraceOverlap> trace_overlap(const std::vector<TraceSpan>& spans);

// The spans within [from_ms, to_ms] of the first span's start.
std::string plot_trace_svg(const std::vector<TraceSpan>& spans, double from_ms = 0,
                           double to_ms = std::numeric_limits<double>::infinity());

}  // namespace hp::train
