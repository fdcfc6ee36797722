// The idle share of a pipelined step, from closed forms. This is the only place the
// estimator asks about bubbles, so a schedule simulator can take it over later.
#pragma once

#include <string>

namespace hp::plan {

// Fraction of the step each stage idles, p = pp, m = microbatches, v = virtual stages:
//   gpipe, 1f1b        (p-1) / (m+p-1)
//   interleaved-1f1b   (p-1) / (v*m+p-1)
//   zb-h1              (p-1) / (3(m+p-1))   weight-gradient passes fill two thirds
//   zbv                (p-1) / (6(m+p-1))   the V placement halves zb-h1 again
// 0 when p == 1. Throws on an unknown schedule.
double pipeline_bubble_fraction(const std::string& schedule, int pp, int microbatches, int virtual_stages);

}  // namespace hp::plan
