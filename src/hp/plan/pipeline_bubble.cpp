#include "hp/plan/pipeline_bubble.h"

#include "hp/base/error.h"

namespace hp::plan {

double pipeline_bubble_fraction(const std::string& schedule, int pp, int microbatches, int virtual_stages) {
  HP_CHECK(pp >= 1 && microbatches >= 1 && virtual_stages >= 1)
      << "pipeline_bubble_fraction: expected pp, microbatches, virtual_stages >= 1, found " << pp << ", "
      << microbatches << ", " << virtual_stages;
  const double p = pp, m = microbatches, v = virtual_stages;
  double f = 0;
  if (schedule == "gpipe" || schedule == "1f1b") f = (p - 1) / (m + p - 1);
  else if (schedule == "interleaved-1f1b") f = (p - 1) / (v * m + p - 1);
  else if (schedule == "zb-h1") f = (p - 1) / (3 * (m + p - 1));
  else if (schedule == "zbv") f = (p - 1) / (6 * (m + p - 1));
  else HP_FAIL() << "pipeline_bubble_fraction: unknown schedule '" << schedule
                 << "'; expected gpipe, 1f1b, interleaved-1f1b, zb-h1 or zbv";
  return pp == 1 ? 0.0 : f;
}

}  // namespace hp::plan
