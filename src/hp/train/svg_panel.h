// The drawing pieces of `hp plot` and `hp monitor plot`: panels stacked in one SVG, each a
// framed plot against step with tick labels and a polyline per series. No external fonts
// or scripts. Torch-free.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace hp::train::svg {

constexpr double kWidth = 640, kPanelHeight = 210;
// Room inside a panel for the title (top), tick labels (left, bottom) and the right edge.
constexpr double kTop = 28, kBottom = 34, kLeft = 72, kRight = 16;

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
Axis make_axis(double lo, double hi, int intervals, double min_spacing);

std::string number(double v);  // a tick label: %g
std::string coord(double v);    // a coordinate: one decimal

// One line of a panel: (step, value) points; non-finite values are left out.
struct Series {
  std::string color;
  std::vector<std::pair<double, double>> points;
};

// The opening <svg> with a white background, of kWidth by `height`.
void begin_svg(std::ostringstream& o, double height);
// A panel of kPanelHeight at `top`: title, frame, ticks of `x` and of the series' range,
// one polyline per series (a lone point shows as a dot).
void draw_panel(std::ostringstream& o, const std::string& title, const std::vector<Series>& series, const Axis& x,
                double top);

}  // namespace hp::train::svg
