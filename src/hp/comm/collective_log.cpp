#include "hp/comm/collective_log.h"

#include <map>
#include <sstream>

#include "hp/base/strings.h"

namespace hp::comm {

std::string CollectiveRecord::to_string() const {
  std::ostringstream os;
  os << op << " " << to_string_list(ranks) << " " << c10::toString(dtype) << " x " << numel;
  return os.str();
}

void CollectiveLog::record(CollectiveRecord r) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  records_.push_back(std::move(r));
}

std::vector<CollectiveRecord> CollectiveLog::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

void CollectiveLog::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  records_.clear();
}

std::vector<CollectiveSummary> summarize(const std::vector<CollectiveRecord>& records) {
  std::map<std::pair<std::string, int>, CollectiveSummary> by;
  for (const auto& r : records) {
    const int n = static_cast<int>(r.ranks.size());
    auto& s = by[{r.op, n}];
    s.op = r.op;
    s.group_size = n;
    ++s.count;
    s.bytes += r.bytes();
  }
  std::vector<CollectiveSummary> out;
  for (auto& [k, s] : by) out.push_back(s);
  return out;
}

}  // namespace hp::comm
