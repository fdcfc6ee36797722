// A process group: an ordered list of global ranks and the c10d backend that joins them.
// The transports that bypass the backend keep their own state per group (the shared-memory
// heap: symm::group_heap; the split into hosts: hier::host_levels) in slots the group holds
// but does not interpret.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <typeindex>
#include <vector>

#include "hp/comm/backend.h"
#include "hp/comm/collective_log.h"

namespace hp {
class ClusterTopology;
}
namespace hp::comm {

class Engine;
class Group;
// Makes (or finds) the group of some global ranks: World::group.
using GroupMaker = std::function<std::shared_ptr<Group>(const std::vector<int>& ranks)>;

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

  // The progress engine that runs this rank's asynchronous shared-memory and hierarchical
  // collectives (hp/comm/engine.h), shared by every group of its World; null for a group
  // made outside a World, whose collectives then all run on the calling thread.
  void set_engine(std::shared_ptr<Engine> engine) { engine_ = std::move(engine); }
  Engine* engine() const { return engine_.get(); }

  // The state a transport keeps for this group, one per type T, made by `make` on first
  // use (under a lock of T's slot alone: making one may be a collective call) and kept as
  // long as the group.
  template <typename T, typename Make>
  std::shared_ptr<T> transport_state(Make&& make) const;

  // A flat buffer of `numel` elements for a collective's output or staging. Buffers are
  // pooled and handed out again once nobody else holds their storage, so steady-state
  // training touches no fresh pages (first-touch page faults cost more than the copies).
  // A fake group allocates afresh: a dry-run counts what a device's runtime would hold.
  at::Tensor buffer(int64_t numel, const at::TensorOptions& options) const;

  // Where the world's ranks run (level 0 of the topology is the host; global ranks are its
  // devices) and how to make groups of some of them: given by World. Null topology: unknown.
  void set_hosts(std::shared_ptr<const ClusterTopology> topology, GroupMaker make_group);
  const ClusterTopology* topology() const { return topology_.get(); }
  // The world's group of some global ranks (a collective call the first time); throws for
  // a group made outside a World.
  std::shared_ptr<Group> make_group(const std::vector<int>& ranks) const;

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
  std::shared_ptr<Engine> engine_;
  mutable std::mutex pool_mu_;
  mutable std::vector<at::Tensor> pool_;
  std::shared_ptr<const ClusterTopology> topology_;
  GroupMaker make_group_;
  struct Slot {
    std::mutex mu;
    std::shared_ptr<void> state;
  };
  mutable std::mutex slots_mu_;
  mutable std::map<std::type_index, std::unique_ptr<Slot>> slots_;
};

template <typename T, typename Make>
std::shared_ptr<T> Group::transport_state(Make&& make) const {
  Slot* slot;
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    auto& s = slots_[std::type_index(typeid(T))];
    if (!s) s = std::make_unique<Slot>();
    slot = s.get();
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  if (!slot->state) slot->state = std::shared_ptr<T>(make());
  return std::static_pointer_cast<T>(slot->state);
}

}  // namespace hp::comm
