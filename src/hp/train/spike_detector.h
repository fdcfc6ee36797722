// Flags a value well above its recent past: the loss or grad-norm spikes of the precision
// monitor. Torch-free.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>

namespace hp::train {

class SpikeDetector {
 public:
  // A value above `factor` times the median of the last `window` values is a spike, once
  // `min_history` values are known (the first steps of a run have no baseline).
  explicit SpikeDetector(double factor, size_t window = 20, size_t min_history = 5);

  // Records `v` (non-finite values are skipped) and returns the median it exceeded when it
  // is a spike. A spike joins the window too, so a lasting jump stops being flagged.
  std::optional<double> observe(double v);

 private:
  double factor_;
  size_t window_, min_history_;
  std::deque<double> recent_;
};

}  // namespace hp::train
