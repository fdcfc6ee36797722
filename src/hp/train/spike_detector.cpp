#include "hp/train/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace hp::train {

SpikeDetector::SpikeDetector(double factor, size_t window, size_t min_history)
    : factor_(factor), window_(window), min_history_(min_history) {}

std::optional<double> SpikeDetector::observe(double v) {
  if (!std::isfinite(v)) return std::nullopt;
  std::optional<double> spike;
  if (recent_.size() >= min_history_) {
    std::vector<double> sorted(recent_.begin(), recent_.end());
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    if (v > factor_ * median) spike = median;
  }
  recent_.push_back(v);
  if (recent_.size() > window_) recent_.pop_front();
  return spike;
}

}  // namespace hp::train
