// plot_metrics_svg: loss, tokens/s and grad norm against step, one panel each.
#include <iterator>
#include <sstream>

#include "hp/base/error.h"
#include "hp/train/metrics.h"
#include "hp/train/svg_panel.h"

namespace hp::train {
namespace {

struct Panel {
  const char* title;
  double MetricsRecord::*member;
};
const Panel kPanels[] = {
    {"loss", &MetricsRecord::loss},
    {"tokens/s", &MetricsRecord::tokens_per_s},
    {"grad norm", &MetricsRecord::grad_norm},
};

}  // namespace

std::string plot_metrics_svg(const std::vector<MetricsRecord>& all) {
  HP_CHECK(!all.empty()) << "no metrics records to plot";
  const std::vector<MetricsRecord> records = last_record_per_step(all);
  const svg::Axis x =
      svg::make_axis(static_cast<double>(records.front().step), static_cast<double>(records.back().step), 6, 1);
  const double height = svg::kPanelHeight * std::size(kPanels) + 20;
  std::ostringstream o;
  svg::begin_svg(o, height);
  double top = 0;
  for (const Panel& p : kPanels) {
    svg::Series line{"#4e79a7", {}};
    for (const MetricsRecord& r : records) line.points.emplace_back(static_cast<double>(r.step), r.*p.member);
    svg::draw_panel(o, p.title, {line}, x, top);
    top += svg::kPanelHeight;
  }
  o << "<text x=\"" << svg::coord((svg::kLeft + svg::kWidth - svg::kRight) / 2) << "\" y=\""
    << svg::coord(height - 6) << "\" text-anchor=\"middle\">step</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace hp::train
