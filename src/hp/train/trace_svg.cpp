#include "hp/train/trace_svg.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "hp/base/error.h"
#include "hp/train/svg_panel.h"

namespace hp::train {
namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, disjoint.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [a, b] : v) {
    if (!out.empty() && a <= out.back().second) out.back().second = std::max(out.back().second, b);
    else out.emplace_back(a, b);
  }
  return out;
}

double length(const Intervals& v) {
  double n = 0;
  for (const auto& [a, b] : v) n += b - a;
  return n;
}

// Both sorted and disjoint.
Intervals intersect(const Intervals& x, const Intervals& y) {
  Intervals out;
  for (size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    const double a = std::max(x[i].first, y[j].first), b = std::min(x[i].second, y[j].second);
    if (a < b) out.emplace_back(a, b);
    (x[i].second < y[j].second ? i : j)++;
  }
  return out;
}

Intervals subtract(const Intervals& x, const Intervals& y) {
  Intervals out;
  size_t j = 0;
  for (auto [a, b] : x) {
    while (j < y.size() && y[j].second <= a) ++j;
    for (size_t k = j; k < y.size() && y[k].first < b; ++k) {
      if (y[k].first > a) out.emplace_back(a, y[k].first);
      a = std::max(a, y[k].second);
    }
    if (a < b) out.emplace_back(a, b);
  }
  return out;
}

const char* color(const std::string& category) {
  if (category == "comm") return "#e8923a";
  if (category == "wait") return "#d23c3c";
  return "#4a7fc1";
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

std::vector<TraceSpan> read_chrome_trace(const std::string& json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  HP_CHECK(!j.is_discarded()) << "trace: not JSON";
  const nlohmann::json& events = j.is_object() ? j.value("traceEvents", nlohmann::json::array()) : j;
  HP_CHECK(events.is_array()) << "trace: no traceEvents array";
  std::vector<TraceSpan> out;
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    TraceSpan s;
    s.name = e.value("name", "");
    s.category = e.value("cat", "");
    s.rank = e.value("pid", 0);
    s.lane = e.value("tid", 0);
    s.begin_ms = e.value("ts", 0.0) / 1000;
    s.duration_ms = e.value("dur", 0.0) / 1000;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<TraceOverlap> trace_overlap(const std::vector<TraceSpan>& spans) {
  std::map<int, Intervals> engine, compute, blocked;
  for (const TraceSpan& s : spans) {
    const std::pair<double, double> i{s.begin_ms, s.end_ms()};
    if (s.lane == 1) engine[s.rank].push_back(i);
    else if (s.category == "compute") compute[s.rank].push_back(i);
    else blocked[s.rank].push_back(i);  // waiting, or running a collective itself
  }
  std::vector<TraceOverlap> out;
  for (auto& [rank, e] : engine) {
    const Intervals comm = merged(e), wait = merged(blocked[rank]);
    const Intervals busy = subtract(merged(compute[rank]), wait);
    TraceOverlap o;
    o.rank = rank;
    o.engine_ms = length(comm);
    o.hidden_ms = length(intersect(comm, busy));
    for (const TraceSpan& s : spans)
      if (s.rank == rank && s.category == "wait") o.wait_ms += s.duration_ms;
    out.push_back(o);
  }
  return out;
}

std::string plot_trace_svg(const std::vector<TraceSpan>& all, double from_ms, double to_ms) {
  HP_CHECK(!all.empty()) << "trace: no spans to draw";
  double origin = all.front().begin_ms;
  for (const TraceSpan& s : all) origin = std::min(origin, s.begin_ms);
  std::vector<TraceSpan> spans;
  std::set<std::pair<int, int>> rows;
  double last = 0;
  for (TraceSpan s : all) {
    s.begin_ms -= origin;
    if (s.end_ms() < from_ms || s.begin_ms > to_ms) continue;
    rows.insert({s.rank, s.lane});
    last = std::max(last, std::min(s.end_ms(), to_ms));
    spans.push_back(std::move(s));
  }
  HP_CHECK(!spans.empty()) << "trace: no span between " << from_ms << " and " << to_ms << " ms";
  const double row_height = 22, top = 36, left = 96, right = svg::kWidth - 16;
  std::map<std::pair<int, int>, int> row_of;
  for (const auto& r : rows) row_of[r] = static_cast<int>(row_of.size());
  const double height = top + row_height * static_cast<double>(rows.size()) + 48;
  const svg::Axis x = svg::make_axis(from_ms, last, 8, 0);
  auto px = [&](double ms) { return left + (right - left) * x.fraction(std::clamp(ms, x.lo(), x.hi())); };

  std::ostringstream o;
  svg::begin_svg(o, height);
  o << "<text x=\"" << svg::coord(left) << "\" y=\"18\" font-size=\"13\">compute (blue), communication "
    << "(orange), waiting on communication (red); ms</text>\n";
  for (const auto& [r, i] : row_of) {
    const double y = top + row_height * i;
    o << "<text x=\"6\" y=\"" << svg::coord(y + 15) << "\">rank " << r.first << (r.second == 1 ? " engine" : " caller")
      << "</text>\n";
    o << "<line x1=\"" << svg::coord(left) << "\" x2=\"" << svg::coord(right) << "\" y1=\"" << svg::coord(y + row_height)
      << "\" y2=\"" << svg::coord(y + row_height) << "\" stroke=\"#ddd\"/>\n";
  }
  const double axis_y = top + row_height * static_cast<double>(rows.size()) + 4;
  for (int64_t t = x.first; t <= x.last; ++t) {
    const double v = static_cast<double>(t) * x.spacing, xx = px(v);
    o << "<line x1=\"" << svg::coord(xx) << "\" x2=\"" << svg::coord(xx) << "\" y1=\"" << svg::coord(top)
      << "\" y2=\"" << svg::coord(axis_y) << "\" stroke=\"#eee\"/>\n";
    o << "<text x=\"" << svg::coord(xx) << "\" y=\"" << svg::coord(axis_y + 14) << "\" text-anchor=\"middle\">"
      << svg::number(v) << "</text>\n";
  }
  // Longer spans first, so the nested (shorter) ones show on top of them.
  std::stable_sort(spans.begin(), spans.end(),
                   [](const TraceSpan& a, const TraceSpan& b) { return a.duration_ms > b.duration_ms; });
  for (const TraceSpan& s : spans) {
    const double y = top + row_height * row_of.at({s.rank, s.lane});
    const double inset = s.category == "compute" ? 3 : 6;
    const double x0 = px(s.begin_ms), x1 = std::max(px(s.end_ms()), x0 + 0.5);
    o << "<rect x=\"" << svg::coord(x0) << "\" y=\"" << svg::coord(y + inset) << "\" width=\"" << svg::coord(x1 - x0)
      << "\" height=\"" << svg::coord(row_height - 2 * inset) << "\" fill=\"" << color(s.category)
      << "\" fill-opacity=\"0.85\"><title>" << escaped(s.name) << " " << svg::number(s.duration_ms)
      << " ms</title></rect>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace hp::train
