// A process group: an ordered list of global ranks and the c10d backend that joins them.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hp/comm/backend.h"
#include "hp/comm/collective_log.h"

namespace hp::symm {
class Heap;
}

namespace hp::comm {

class Group {
 public:
  // `store`: the group's own (prefixed) rendezvous store. `on_one_host`: every member
  // runs on this host, so they can share memory.
  Group(std::vector<int> ranks, int global_rank, BackendPtr backend, std::chrono::milliseconds timeout,
        std::string device, StorePtr store = {}, bool on_one_host = false);

  int rank() const { return rank_; }  // this process's index in the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  // global ranks, in group order
  int global_rank(int group_rank) const { return ranks_.at(group_rank); }
  int group_rank_of(int global_rank) const;  // throws if not a member
  Backend& backend() const { return *backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& device() const { return device_; }
  std::string describe() const;  // "group [0, 2] (rank 1 of 2)"
  const StorePtr& store() const { return store_; }
  // Never for a fake backend: its peers do not exist, so nothing may bypass it.
  bool on_one_host() const { return on_one_host_ && store_ && !fake_; }
  bool is_fake() const { return fake_; }

  // Where the collectives record what they issue (the world's log).
  void set_log(std::shared_ptr<CollectiveLog> log) { log_ = std::move(log); }
  void record(const char* op, const at::Tensor& t) const;

  // The group's symmetric heap (hp/comm/symm), created on first use: a collective call,
  // so every member must reach it at the same point of its sequence of collectives.
  std::shared_ptr<symm::Heap> symm_heap() const;

  // A flat buffer of `numel` elements for a collective's output or staging. Buffers are
  // pooled and handed out again once nobody else holds their storage, so steady-state
  // training touches no fresh pages (first-touch page faults cost more than the copies).
  // A fake group allocates afresh: a dry-run counts what a device's runtime would hold.
  at::Tensor buffer(int64_t numel, const at::TensorOptions& options) const;

 private:
  std::vector<int> ranks_;
  int rank_;
  BackendPtr backend_;
  std::chrono::milliseconds timeout_;
  std::string device_;
  StorePtr store_;
  bool on_one_host_;
  bool fake_;
  std::shared_ptr<CollectiveLog> log_;
  mutable std::mutex heap_mu_;
  mutable std::shared_ptr<symm::Heap> heap_;
  mutable std::mutex pool_mu_;
  mutable std::vector<at::Tensor> pool_;
};

}  // namespace hp::comm
