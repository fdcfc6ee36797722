// The metrics file of `hp train`: one JSON object per logged step, appended and flushed as
// the run goes, read back by `hp plot`. Torch-free, so tools read it without LibTorch.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace hp::train {

// One logged step, as `hp train` writes it to its metrics file (one JSON object per line).
struct MetricsRecord {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms_per_step = 0, tokens_per_s = 0;
  double mfu = 0;     // model FLOP/s over the peak; 0 when unknown
  double bubble = 0;  // pipeline idle share of the step; 0 without pipeline parallelism
  double rss_mib = 0;
  double expert_load = 0;  // MoE: max / mean tokens per expert of the step (worst block); 0 when dense
};

// {"step":10,"loss":2.5,...}: keys as the field names, no trailing newline. JSON has no NaN
// or infinity, so a diverged loss is written as null (read back as NaN).
std::string to_json_line(const MetricsRecord& r);

// Appends to `path`, one line per record, flushed (a killed run keeps what it logged).
// Errors name the path.
class MetricsWriter {
 public:
  // append = false starts the file afresh; a resumed run appends to what it logged before.
  explicit MetricsWriter(const std::string& path, bool append);
  void write(const MetricsRecord& r);

 private:
  std::string path_;
  std::ofstream out_;
};

// Reads every line (blank lines are skipped); a malformed line is an error naming the file
// and line number; unknown keys are ignored, missing keys keep their defaults (older files
// still plot).
std::vector<MetricsRecord> read_metrics(const std::string& path);

// A run resumed from a checkpoint appends to the same file and logs some steps again: the
// last record of each step, in step order.
std::vector<MetricsRecord> last_record_per_step(const std::vector<MetricsRecord>& records);

// An SVG with three panels stacked (loss, tokens/s, grad norm) against step: axes with tick
// labels, a polyline per panel, the panel title; no external fonts or scripts. Plots the
// last record of each step; values that are not finite are left out. Empty input is an error.
std::string plot_metrics_svg(const std::vector<MetricsRecord>& records);

}  // namespace hp::train
