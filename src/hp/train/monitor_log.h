// The precision monitor's file: JSON lines written by rank 0 of `hp train` ([monitor]),
// read back by `hp monitor plot` and `hp diff`. Three kinds of line:
//   {"step":10,"loss":2.5,"grad_norm":0.8}                                  a monitored step
//   {"step":10,"module":"layers.0.mlp.down_proj","act_norm":3.1,"grad_norm":0.02}
//   {"step":12,"event":"loss_spike","value":9.1,"median":2.4}               a spike
// Module lines of a step come in the order the forward pass ran them. Torch-free.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace hp::train {

struct MonitorRecord {
  int64_t step = 0;
  std::string module;  // set on a module's line
  std::string event;   // set on a spike's line: "loss_spike" or "grad_norm_spike"
  double loss = 0;       // a step's line
  double act_norm = 0;   // a module's line: L2 norm of its forward output (whole tensor, all ranks)
  double grad_norm = 0;  // a step's line: of all gradients; a module's: of the gradient into its output
  double value = 0, median = 0;  // a spike's line: the value and the running median it exceeded

  bool is_module() const { return !module.empty(); }
  bool is_event() const { return !event.empty(); }
};

// One line, no newline. Non-finite numbers are written as null (read back as NaN).
std::string to_json_line(const MonitorRecord& r);

// Appends records to `path`, one flushed line each; errors name the path.
class MonitorWriter {
 public:
  // append = false starts the file afresh; a resumed run appends.
  MonitorWriter(const std::string& path, bool append);
  void write(const MonitorRecord& r);
  void write(const std::vector<MonitorRecord>& records);  // flushed once, after the last

 private:
  std::string path_;
  std::ofstream out_;
};

// Every line of `path` (blank ones skipped); errors name the file and line.
std::vector<MonitorRecord> read_monitor_log(const std::string& path);

// Step and module lines (spikes dropped), the last of each (step, module) kept (a resumed
// run logs some steps twice), in step order and, within a step, in the order first written.
std::vector<MonitorRecord> latest_norms(const std::vector<MonitorRecord>& records);

// Where two logs first disagree: the lowest step, then the first line of that step in `a`,
// whose loss, grad_norm or act_norm differ beyond `rtol` (relative to the larger).
struct Divergence {
  int64_t step = 0;
  std::string module;  // "" for the step's own line
  std::string metric;  // "loss", "grad_norm" or "act_norm"
  double a = 0, b = 0;
};
struct LogComparison {
  std::optional<Divergence> first;
  int64_t steps_compared = 0, lines_compared = 0;  // lines present in both logs
};
LogComparison compare_monitor_logs(const std::vector<MonitorRecord>& a, const std::vector<MonitorRecord>& b,
                                   double rtol);

}  // namespace hp::train
