#include "hp/train/svg_panel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hp::train::svg {

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

void begin_svg(std::ostringstream& o, double height) {
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << coord(kWidth) << "\" height=\"" << coord(height)
    << "\" viewBox=\"0 0 " << coord(kWidth) << ' ' << coord(height)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}

void draw_panel(std::ostringstream& o, const std::string& title, const std::vector<Series>& series, const Axis& x,
                double top) {
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = top + kTop, y1 = top + kPanelHeight - kBottom;
  bool any = false;
  double lo = 0, hi = 0;
  for (const Series& s : series) {
    for (const auto& [step, v] : s.points) {
      if (!std::isfinite(v)) continue;
      lo = any ? std::min(lo, v) : v;
      hi = any ? std::max(hi, v) : v;
      any = true;
    }
  }
  const Axis y = make_axis(lo, hi, 4, 0);
  auto px = [&](double step) { return x0 + x.fraction(step) * (x1 - x0); };
  auto py = [&](double v) { return y1 - y.fraction(v) * (y1 - y0); };

  o << "<g>\n<text x=\"" << coord(x0) << "\" y=\"" << coord(top + 18) << "\" font-size=\"13\">" << title
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
  for (const Series& s : series) {
    std::vector<std::string> points;
    for (const auto& [step, v] : s.points)
      if (std::isfinite(v)) points.push_back(coord(px(step)) + ',' + coord(py(v)));
    if (points.size() == 1) points.push_back(points.front());  // with round caps, a lone point shows as a dot
    o << "<polyline fill=\"none\" stroke=\"" << s.color
      << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"";
    for (size_t i = 0; i < points.size(); ++i) o << (i ? " " : "") << points[i];
    o << "\"/>\n";
  }
  o << "</g>\n";
}

}  // namespace hp::train::svg
