#include <fstream>
#include <nlohmann/json.hpp>

#include "hp/base/error.h"
#include "hp/schedule/render.h"

namespace hp::schedule {

std::string render_chrome_trace(const Schedule& s, const SimResult& sim, double us_per_unit) {
  using nlohmann::json;
  json events = json::array();
  for (int r = 0; r < s.num_ranks; ++r) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0},
                      {"args", {{"name", "compute"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 1},
                      {"args", {{"name", "p2p"}}}});
    for (const TimedAction& t : sim.timeline[r]) {
      const Action& a = t.action;
      json ev = {{"name", to_string(a)},
                 {"cat", to_string(a.type)},
                 {"ph", "X"},
                 {"pid", r},
                 {"tid", is_comm(a.type) ? 1 : 0},
                 {"ts", t.start * us_per_unit},
                 {"dur", (t.end - t.start) * us_per_unit},
                 {"args", {{"stage", a.stage}, {"microbatch", a.microbatch}}}};
      if (is_comm(a.type)) ev["args"]["peer"] = a.peer;
      events.push_back(std::move(ev));
    }
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"schedule", s.name},
                {"makespan", sim.makespan},
                {"bubble_ratio", sim.bubble_ratio}}}};
  return doc.dump(1);
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  HP_CHECK(out.good()) << "cannot open '" << path << "' for writing";
  out << text;
  out.close();
  HP_CHECK(out.good()) << "failed writing '" << path << "'";
}

}  // namespace hp::schedule
