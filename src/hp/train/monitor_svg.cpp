#include "hp/train/monitor_svg.h"

#include <cmath>
#include <iterator>
#include <map>
#include <sstream>

#include "hp/base/error.h"
#include "hp/train/svg_panel.h"

namespace hp::train {
namespace {

const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr int kLegendColumns = 3;
constexpr double kLegendRow = 14;

}  // namespace

std::string plot_monitor_svg(const std::vector<MonitorRecord>& all) {
  const std::vector<MonitorRecord> records = latest_norms(all);
  HP_CHECK(!records.empty()) << "no monitor records to plot";
  // Modules in the order of their first line: the forward pass's order.
  std::vector<std::string> modules;
  std::map<std::string, size_t> index;
  for (const MonitorRecord& r : records)
    if (r.is_module() && index.emplace(r.module, modules.size()).second) modules.push_back(r.module);

  svg::Series loss{kPalette[0], {}};
  std::vector<svg::Series> act(modules.size()), grad(modules.size());
  for (size_t i = 0; i < modules.size(); ++i) act[i].color = grad[i].color = kPalette[i % std::size(kPalette)];
  for (const MonitorRecord& r : records) {
    const double step = static_cast<double>(r.step);
    if (!r.is_module()) {
      loss.points.emplace_back(step, r.loss);
      continue;
    }
    const size_t i = index.at(r.module);
    act[i].points.emplace_back(step, std::log10(r.act_norm));  // 0 and below leave the plot
    grad[i].points.emplace_back(step, std::log10(r.grad_norm));
  }

  const svg::Axis x =
      svg::make_axis(static_cast<double>(records.front().step), static_cast<double>(records.back().step), 6, 1);
  const size_t legend_rows = (modules.size() + kLegendColumns - 1) / kLegendColumns;
  const double panels = 3 * svg::kPanelHeight, height = panels + 24 + kLegendRow * double(legend_rows) + 8;
  std::ostringstream o;
  svg::begin_svg(o, height);
  svg::draw_panel(o, "loss", {loss}, x, 0);
  svg::draw_panel(o, "activation norm (log10)", act, x, svg::kPanelHeight);
  svg::draw_panel(o, "output gradient norm (log10)", grad, x, 2 * svg::kPanelHeight);
  o << "<text x=\"" << svg::coord((svg::kLeft + svg::kWidth - svg::kRight) / 2) << "\" y=\"" << svg::coord(panels + 4)
    << "\" text-anchor=\"middle\">step</text>\n";
  const double column = (svg::kWidth - svg::kLeft) / kLegendColumns;
  for (size_t i = 0; i < modules.size(); ++i) {
    const double lx = svg::kLeft + column * double(i % kLegendColumns);
    const double ly = panels + 24 + kLegendRow * double(i / kLegendColumns);
    o << "<line x1=\"" << svg::coord(lx) << "\" y1=\"" << svg::coord(ly - 4) << "\" x2=\"" << svg::coord(lx + 14)
      << "\" y2=\"" << svg::coord(ly - 4) << "\" stroke=\"" << act[i].color << "\" stroke-width=\"2\"/>\n";
    o << "<text x=\"" << svg::coord(lx + 18) << "\" y=\"" << svg::coord(ly) << "\">" << modules[i] << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace hp::train
