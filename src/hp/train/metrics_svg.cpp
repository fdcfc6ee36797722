// plot_metrics_svg: loss, tokens/s and grad norm against step, one panel each.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <sstream>

#include "hp/base/error.h"
#include "hp/train/metrics.h"

namespace hp::train {
namespace {

constexpr double kWidth = 640, kPanelHeight = 210;
// Room inside a panel for the title (top), tick labels (left, bottom) and the right edge.
constexpr double kTop = 28, kBottom = 34, kLeft = 72, kRight = 16;

struct Panel {
  const char* title;
  double MetricsRecord::*member;
};
const Panel kPanels[] = {
    {"loss", &MetricsRecord::loss},
    {"tokens/s", &MetricsRecord::tokens_per_s},
    {"grad norm", &MetricsRecord::grad_norm},
};

// An axis from first * spacing to last * spacing; the spacing is 1, 2 or 5 times a power
// of ten, so tick labels are short. Indices, not values, so that zero prints as "0".
struct Axis {
  int64_t first = 0, last = 0;
  double spacing = 1;
  double lo() const { return static_cast<double>(first) * spacing; }
  double hi() const { return static_cast<double>(last) * spacing; }
  double fraction(double v) const { return (v - lo()) / (hi() - lo()); }
};

// About `intervals` ticks over [lo, hi], widened to whole ticks; a flat series gets a range
// around its value. `min_spacing` keeps step ticks on whole steps.
Axis make_axis(double lo, double hi, int intervals, double min_spacing) {
  if (hi <= lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / intervals;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  double spacing = 10 * power;
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw) {
      spacing = m * power;
      break;
    }
  }
  spacing = std::max(spacing, min_spacing);
  Axis a;
  a.spacing = spacing;
  a.first = static_cast<int64_t>(std::floor(lo / spacing));
  a.last = static_cast<int64_t>(std::ceil(hi / spacing));
  if (a.last == a.first) ++a.last;
  return a;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string coord(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

void draw_panel(std::ostringstream& o, const Panel& p, const std::vector<MetricsRecord>& records, const Axis& x,
                double top) {
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = top + kTop, y1 = top + kPanelHeight - kBottom;
  bool any = false;
  double lo = 0, hi = 0;
  for (const MetricsRecord& r : records) {
    const double v = r.*p.member;
    if (!std::isfinite(v)) continue;
    lo = any ? std::min(lo, v) : v;
    hi = any ? std::max(hi, v) : v;
    any = true;
  }
  const Axis y = make_axis(lo, hi, 4, 0);
  auto px = [&](double step) { return x0 + x.fraction(step) * (x1 - x0); };
  auto py = [&](double v) { return y1 - y.fraction(v) * (y1 - y0); };

  o << "<g>\n<text x=\"" << coord(x0) << "\" y=\"" << coord(top + 18) << "\" font-size=\"13\">" << p.title
    << (any ? "" : " (no finite values)") << "</text>\n";
  o << "<rect x=\"" << coord(x0) << "\" y=\"" << coord(y0) << "\" width=\"" << coord(x1 - x0) << "\" height=\""
    << coord(y1 - y0) << "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (int64_t k = y.first; k <= y.last; ++k) {
    const double v = static_cast<double>(k) * y.spacing, ty = py(v);
    o << "<line x1=\"" << coord(x0 - 4) << "\" y1=\"" << coord(ty) << "\" x2=\"" << coord(x1) << "\" y2=\""
      << coord(ty) << "\" stroke=\"#ddd\"/>\n";
    o << "<text x=\"" << coord(x0 - 6) << "\" y=\"" << coord(ty + 4) << "\" text-anchor=\"end\">" << number(v)
      << "</text>\n";
  }
  for (int64_t k = x.first; k <= x.last; ++k) {
    const double v = static_cast<double>(k) * x.spacing, tx = px(v);
    o << "<line x1=\"" << coord(tx) << "\" y1=\"" << coord(y1) << "\" x2=\"" << coord(tx) << "\" y2=\""
      << coord(y1 + 4) << "\" stroke=\"#888\"/>\n";
    o << "<text x=\"" << coord(tx) << "\" y=\"" << coord(y1 + 16) << "\" text-anchor=\"middle\">" << number(v)
      << "</text>\n";
  }
  std::vector<std::string> points;
  for (const MetricsRecord& r : records) {
    const double v = r.*p.member;
    if (std::isfinite(v)) points.push_back(coord(px(static_cast<double>(r.step))) + ',' + coord(py(v)));
  }
  if (points.size() == 1) points.push_back(points.front());  // with round caps, a lone point shows as a dot
  o << "<polyline fill=\"none\" stroke=\"#4e79a7\" stroke-width=\"1.5\" stroke-linejoin=\"round\" "
       "stroke-linecap=\"round\" points=\"";
  for (size_t i = 0; i < points.size(); ++i) o << (i ? " " : "") << points[i];
  o << "\"/>\n</g>\n";
}

}  // namespace

std::string plot_metrics_svg(const std::vector<MetricsRecord>& all) {
  HP_CHECK(!all.empty()) << "no metrics records to plot";
  const std::vector<MetricsRecord> records = last_record_per_step(all);
  const Axis x =
      make_axis(static_cast<double>(records.front().step), static_cast<double>(records.back().step), 6, 1);
  const double height = kPanelHeight * std::size(kPanels) + 20;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << coord(kWidth) << "\" height=\"" << coord(height)
    << "\" viewBox=\"0 0 " << coord(kWidth) << ' ' << coord(height)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  double top = 0;
  for (const Panel& p : kPanels) {
    draw_panel(o, p, records, x, top);
    top += kPanelHeight;
  }
  o << "<text x=\"" << coord((kLeft + kWidth - kRight) / 2) << "\" y=\"" << coord(height - 6)
    << "\" text-anchor=\"middle\">step</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace hp::train
