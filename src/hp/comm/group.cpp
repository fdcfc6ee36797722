#include "hp/comm/group.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/fake_backend.h"

namespace hp::comm {

Group::Group(std::vector<int> ranks, int global_rank, BackendPtr backend,
             std::chrono::milliseconds timeout, std::string device, StorePtr store, bool on_one_host)
    : ranks_(std::move(ranks)), rank_(group_rank_of(global_rank)), backend_(std::move(backend)),
      timeout_(timeout), device_(std::move(device)), store_(std::move(store)), on_one_host_(on_one_host),
      fake_(backend_ && hp::comm::is_fake(*backend_)) {}

void Group::record(const char* op, const at::Tensor& t) const {
  if (log_ && log_->enabled() && size() > 1) log_->record({op, ranks_, t.defined() ? t.scalar_type() : at::kByte, t.defined() ? t.numel() : 0});
}

void Group::set_hosts(std::shared_ptr<const ClusterTopology> topology, GroupMaker make_group) {
  topology_ = std::move(topology);
  make_group_ = std::move(make_group);
}

std::shared_ptr<Group> Group::make_group(const std::vector<int>& ranks) const {
  HP_CHECK(make_group_) << describe() << ": made outside a World, it has no world to make groups in";
  return make_group_(ranks);
}

int Group::group_rank_of(int global_rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), global_rank);
  HP_CHECK(it != ranks_.end()) << "rank " << global_rank << " is not in group " << to_string_list(ranks_);
  return static_cast<int>(it - ranks_.begin());
}

at::Tensor Group::buffer(int64_t numel, const at::TensorOptions& options) const {
  constexpr size_t kMaxPooled = 8;
  if (fake_) return at::empty({numel}, options);
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (const at::Tensor& b : pool_) {
    // Free when the pool holds the only reference to the storage.
    if (b.storage().use_count() == 1 && b.numel() >= numel && b.dtype() == options.dtype() &&
        b.device() == options.device())
      return b.narrow(0, 0, numel);
  }
  at::Tensor fresh = at::empty({numel}, options);
  if (pool_.size() < kMaxPooled) {
    pool_.push_back(fresh);
  } else {
    // Full: the new buffer takes the place of the smallest free one, so the pool follows
    // the sizes in use instead of keeping the first ones it saw.
    at::Tensor* victim = nullptr;
    for (at::Tensor& b : pool_)
      if (b.storage().use_count() == 1 && (!victim || b.numel() < victim->numel())) victim = &b;
    if (victim) *victim = fresh;
  }
  return fresh.narrow(0, 0, numel);  // a tensor of its own, so the storage count tells
}

std::string Group::describe() const {
  return "group " + to_string_list(ranks_) + " (rank " + std::to_string(rank_) + " of " +
         std::to_string(size()) + ")";
}

}  // namespace hp::comm
