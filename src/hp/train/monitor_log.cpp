#include "hp/train/monitor_log.h"

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "hp/base/error.h"
#include "hp/train/json_lines.h"

namespace hp::train {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written

struct TextKey {
  const char* key;
  std::string MonitorRecord::*member;
};
const TextKey kTextKeys[] = {{"module", &MonitorRecord::module}, {"event", &MonitorRecord::event}};

struct NumberKey {
  const char* key;
  double MonitorRecord::*member;
};
const NumberKey kNumberKeys[] = {
    {"loss", &MonitorRecord::loss},         {"act_norm", &MonitorRecord::act_norm},
    {"grad_norm", &MonitorRecord::grad_norm}, {"value", &MonitorRecord::value},
    {"median", &MonitorRecord::median},
};

MonitorRecord parse_line(const std::string& line, const std::string& path, int64_t n) {
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::parse_error& e) {
    HP_FAIL() << path << " line " << n << ": not valid JSON at byte " << e.byte << ": " << line;
  }
  HP_CHECK(j.is_object()) << path << " line " << n << ": expected a JSON object, got " << line;
  MonitorRecord r;
  auto step = j.find("step");
  HP_CHECK(step != j.end() && step->is_number_integer()) << path << " line " << n << ": needs an integer \"step\"";
  r.step = step->get<int64_t>();
  for (const TextKey& k : kTextKeys) {
    auto it = j.find(k.key);
    if (it == j.end()) continue;
    HP_CHECK(it->is_string()) << path << " line " << n << ": \"" << k.key << "\" must be a string, got " << it->dump();
    r.*k.member = it->get<std::string>();
  }
  for (const NumberKey& k : kNumberKeys) {
    auto it = j.find(k.key);
    if (it == j.end()) continue;
    HP_CHECK(it->is_null() || it->is_number())
        << path << " line " << n << ": \"" << k.key << "\" must be a number, got " << it->dump();
    r.*k.member = it->is_null() ? std::numeric_limits<double>::quiet_NaN() : it->get<double>();
  }
  return r;
}

// Equal within rtol of the larger magnitude; two non-finite values of the same kind agree.
bool close(double a, double b, double rtol) {
  if (!std::isfinite(a) || !std::isfinite(b)) return (std::isnan(a) && std::isnan(b)) || a == b;
  return std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b));
}

}  // namespace

std::string to_json_line(const MonitorRecord& r) {
  Json j;  // dump() writes NaN and infinity as null
  j["step"] = r.step;
  if (r.is_event()) {
    j["event"] = r.event, j["value"] = r.value, j["median"] = r.median;
  } else if (r.is_module()) {
    j["module"] = r.module, j["act_norm"] = r.act_norm, j["grad_norm"] = r.grad_norm;
  } else {
    j["loss"] = r.loss, j["grad_norm"] = r.grad_norm;
  }
  return j.dump();
}

MonitorWriter::MonitorWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  HP_CHECK(out_.is_open()) << "cannot open the monitor file '" << path << "' for writing";
}

void MonitorWriter::write(const MonitorRecord& r) { write(std::vector<MonitorRecord>{r}); }

void MonitorWriter::write(const std::vector<MonitorRecord>& records) {
  for (const MonitorRecord& r : records) out_ << to_json_line(r) << '\n';
  out_ << std::flush;
  HP_CHECK(out_.good()) << "failed writing the monitor file '" << path_ << "'";
}

std::vector<MonitorRecord> read_monitor_log(const std::string& path) { return read_json_lines(path, "monitor file", parse_line); }

std::vector<MonitorRecord> latest_norms(const std::vector<MonitorRecord>& records) {
  std::map<int64_t, std::vector<std::string>> order;  // modules of each step, first written first
  std::map<std::pair<int64_t, std::string>, MonitorRecord> latest;
  for (const MonitorRecord& r : records) {
    if (r.is_event()) continue;
    auto [it, added] = latest.insert_or_assign({r.step, r.module}, r);
    if (added) order[r.step].push_back(r.module);
  }
  std::vector<MonitorRecord> out;
  for (const auto& [step, modules] : order)
    for (const std::string& m : modules) out.push_back(latest.at({step, m}));
  return out;
}

LogComparison compare_monitor_logs(const std::vector<MonitorRecord>& a, const std::vector<MonitorRecord>& b,
                                   double rtol) {
  std::map<std::pair<int64_t, std::string>, MonitorRecord> in_b;
  for (const MonitorRecord& r : latest_norms(b)) in_b[{r.step, r.module}] = r;
  LogComparison result;
  int64_t last_step = std::numeric_limits<int64_t>::min();
  for (const MonitorRecord& x : latest_norms(a)) {
    auto it = in_b.find({x.step, x.module});
    if (it == in_b.end()) continue;
    const MonitorRecord& y = it->second;
    if (x.step != last_step) ++result.steps_compared, last_step = x.step;
    ++result.lines_compared;
    std::vector<std::pair<const char*, double MonitorRecord::*>> metrics;
    if (x.is_module())
      metrics = {{"act_norm", &MonitorRecord::act_norm}, {"grad_norm", &MonitorRecord::grad_norm}};
    else
      metrics = {{"loss", &MonitorRecord::loss}, {"grad_norm", &MonitorRecord::grad_norm}};
    for (const auto& [name, member] : metrics) {
      if (close(x.*member, y.*member, rtol)) continue;
      result.first = Divergence{x.step, x.module, name, x.*member, y.*member};
      return result;
    }
  }
  return result;
}

}  // namespace hp::train
