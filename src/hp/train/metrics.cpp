// The metrics file: one table of keys drives both the writer and the reader.
#include "hp/train/metrics.h"

#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "hp/base/error.h"
#include "hp/train/json_lines.h"

namespace hp::train {
namespace {

// Ordered so that a line reads in the struct's order when someone opens the file.
using Json = nlohmann::ordered_json;

struct DoubleKey {
  const char* key;
  double MetricsRecord::*member;
};

// Every field after `step`, in the struct's order.
const DoubleKey kDoubleKeys[] = {
    {"loss", &MetricsRecord::loss},
    {"grad_norm", &MetricsRecord::grad_norm},
    {"lr", &MetricsRecord::lr},
    {"ms_per_step", &MetricsRecord::ms_per_step},
    {"tokens_per_s", &MetricsRecord::tokens_per_s},
    {"mfu", &MetricsRecord::mfu},
    {"bubble", &MetricsRecord::bubble},
    {"rss_mib", &MetricsRecord::rss_mib},
    {"expert_load", &MetricsRecord::expert_load},
};

MetricsRecord parse_line(const std::string& line, const std::string& path, int64_t line_number) {
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::parse_error& e) {
    HP_FAIL() << path << " line " << line_number << ": not valid JSON at byte " << e.byte << ": " << line;
  }
  HP_CHECK(j.is_object()) << path << " line " << line_number << ": expected a JSON object, got " << line;
  MetricsRecord r;
  if (auto it = j.find("step"); it != j.end()) {
    HP_CHECK(it->is_number_integer()) << path << " line " << line_number << ": \"step\" must be an integer, got "
                                      << it->dump();
    r.step = it->get<int64_t>();
  }
  for (const DoubleKey& k : kDoubleKeys) {
    auto it = j.find(k.key);
    if (it == j.end()) continue;
    if (it->is_null()) {  // how a NaN or infinity was written
      r.*k.member = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    HP_CHECK(it->is_number()) << path << " line " << line_number << ": \"" << k.key << "\" must be a number, got "
                              << it->dump();
    r.*k.member = it->get<double>();
  }
  return r;
}

}  // namespace

std::string to_json_line(const MetricsRecord& r) {
  Json j;
  j["step"] = r.step;
  for (const DoubleKey& k : kDoubleKeys) j[k.key] = r.*k.member;  // dump() writes NaN and infinity as null
  return j.dump();
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  HP_CHECK(out_.is_open()) << "cannot open the metrics file '" << path << "' for writing";
}

void MetricsWriter::write(const MetricsRecord& r) {
  out_ << to_json_line(r) << '\n' << std::flush;
  HP_CHECK(out_.good()) << "failed writing the metrics file '" << path_ << "'";
}

std::vector<MetricsRecord> read_metrics(const std::string& path) { return read_json_lines(path, "metrics file", parse_line); }

std::vector<MetricsRecord> last_record_per_step(const std::vector<MetricsRecord>& records) {
  std::map<int64_t, MetricsRecord> by_step;
  for (const MetricsRecord& r : records) by_step[r.step] = r;  // a later line wins
  std::vector<MetricsRecord> out;
  out.reserve(by_step.size());
  for (const auto& [step, r] : by_step) out.push_back(r);
  return out;
}

}  // namespace hp::train
