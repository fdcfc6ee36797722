#include <cmath>
#include <sstream>

#include "hp/schedule/render.h"

namespace hp::schedule {

namespace {

const char* fill_of(ActionType t) {
  switch (t) {
    case ActionType::F: return "#4e79a7";
    case ActionType::B: return "#59a14f";
    case ActionType::I: return "#76b7b2";
    case ActionType::W: return "#f28e2b";
    default: return "#bab0ac";
  }
}

// Schedule names come from users and files: keep them from breaking the markup.
std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string render_svg(const Schedule& s, const SimResult& sim, const SvgOptions& opt) {
  const double left = 70, top = 30, gap = 6;
  const double row = opt.row_height;
  const double width = left + sim.makespan * opt.px_per_unit + 20;
  const double axis_y = top + s.num_ranks * (row + gap);
  const double height = axis_y + 50;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<text x=\"" << left << "\" y=\"18\" font-size=\"13\">" << escape(s.name) << ": " << s.num_ranks
    << " ranks, " << s.num_stages << " stages, " << s.num_microbatches
    << " microbatches, makespan " << sim.makespan << ", bubble "
    << std::round(sim.bubble_ratio * 1000) / 10 << "%</text>\n";
  for (int r = 0; r < s.num_ranks; ++r) {
    const double y = top + r * (row + gap);
    o << "<text x=\"8\" y=\"" << y + row * 0.65 << "\">rank " << r << "</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << sim.makespan * opt.px_per_unit
      << "\" height=\"" << row << "\" fill=\"#f4f4f4\"/>\n";
    for (const TimedAction& t : sim.timeline[r]) {
      if (!is_compute(t.action.type) || t.end <= t.start) continue;
      const double x = left + t.start * opt.px_per_unit;
      const double w = (t.end - t.start) * opt.px_per_unit;
      o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << row
        << "\" fill=\"" << fill_of(t.action.type) << "\" stroke=\"white\"><title>"
        << escape(to_string(t.action)) << " [" << t.start << ", " << t.end << ")</title></rect>\n";
      if (opt.labels)
        o << "<text x=\"" << x + w / 2 << "\" y=\"" << y + row * 0.65
          << "\" text-anchor=\"middle\" fill=\"white\">" << to_string(t.action.type)
          << t.action.stage << "." << t.action.microbatch << "</text>\n";
    }
  }
  // Time axis with about ten ticks.
  const double step = std::max(1.0, std::ceil(sim.makespan / 10));
  o << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\""
    << left + sim.makespan * opt.px_per_unit << "\" y2=\"" << axis_y << "\" stroke=\"#333\"/>\n";
  for (double t = 0; t <= sim.makespan + 1e-9; t += step)
    o << "<text x=\"" << left + t * opt.px_per_unit << "\" y=\"" << axis_y + 14
      << "\" text-anchor=\"middle\">" << t << "</text>\n";
  double lx = left;
  for (ActionType t : {ActionType::F, ActionType::B, ActionType::I, ActionType::W}) {
    o << "<rect x=\"" << lx << "\" y=\"" << axis_y + 26 << "\" width=\"12\" height=\"12\" fill=\""
      << fill_of(t) << "\"/><text x=\"" << lx + 16 << "\" y=\"" << axis_y + 36 << "\">"
      << to_string(t) << "</text>\n";
    lx += 40;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace hp::schedule
