// A process group: an ordered list of global ranks and the c10d backend that joins them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "hp/comm/backend.h"

namespace hp::comm {

class Group {
 public:
  Group(std::vector<int> ranks, int global_rank, BackendPtr backend, std::chrono::milliseconds timeout,
        std::string device);

  int rank() const { return rank_; }  // this process's index in the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  // global ranks, in group order
  int global_rank(int group_rank) const { return ranks_.at(group_rank); }
  int group_rank_of(int global_rank) const;  // throws if not a member
  Backend& backend() const { return *backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& device() const { return device_; }
  std::string describe() const;  // "group [0, 2] (rank 1 of 2)"

 private:
  std::vector<int> ranks_;
  int rank_;
  BackendPtr backend_;
  std::chrono::milliseconds timeout_;
  std::string device_;
};

}  // namespace hp::comm
