// `hp monitor plot`: the precision monitor's file drawn as SVG. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "hp/train/monitor_log.h"

namespace hp::train {

// Three panels against step: the loss, then log10 of each module's activation norm and of
// its output-gradient norm (a line per module, coloured as in the legend below them). The
// last line of each (step, module) is drawn; no norms at all is an error.
std::string plot_monitor_svg(const std::vector<MonitorRecord>& records);

}  // namespace hp::train
