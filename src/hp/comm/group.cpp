#include "hp/comm/group.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::comm {

Group::Group(std::vector<int> ranks, int global_rank, BackendPtr backend,
             std::chrono::milliseconds timeout, std::string device)
    : ranks_(std::move(ranks)), rank_(group_rank_of(global_rank)), backend_(std::move(backend)),
      timeout_(timeout), device_(std::move(device)) {}

int Group::group_rank_of(int global_rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), global_rank);
  HP_CHECK(it != ranks_.end()) << "rank " << global_rank << " is not in group " << to_string_list(ranks_);
  return static_cast<int>(it - ranks_.begin());
}

std::string Group::describe() const {
  return "group " + to_string_list(ranks_) + " (rank " + std::to_string(rank_) + " of " +
         std::to_string(size()) + ")";
}

}  // namespace hp::comm
