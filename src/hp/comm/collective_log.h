// The collectives a rank issues, in issue order: what a dry-run reports and what tests
// compare between a fake world and a real one. Recorded by hp::comm's collectives (the
// semantic op, whichever path carries it: Gloo, shared memory or a fake backend), for
// groups of two ranks or more; off until enabled.
#pragma once

#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hp::comm {

struct CollectiveRecord {
  std::string op;          // all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, barrier
  std::vector<int> ranks;  // the group's global ranks, in group order
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;       // elements of this rank's input

  int64_t bytes() const { return numel * static_cast<int64_t>(c10::elementSize(dtype)); }
  bool operator==(const CollectiveRecord& o) const {
    return op == o.op && ranks == o.ranks && dtype == o.dtype && numel == o.numel;
  }
  std::string to_string() const;  // "all_gather [0, 2] Float x 1024"
};

class CollectiveLog {
 public:
  void enable(bool on = true) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void record(CollectiveRecord r);
  std::vector<CollectiveRecord> records() const;
  void clear();

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::vector<CollectiveRecord> records_;
};

// Count and bytes per (op, group size), for reports.
struct CollectiveSummary {
  std::string op;
  int group_size = 0;
  int64_t count = 0;
  int64_t bytes = 0;
};
std::vector<CollectiveSummary> summarize(const std::vector<CollectiveRecord>& records);

}  // namespace hp::comm
