// A process group: an ordered list of global ranks and the c10d backend that joins them.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hp/comm/backend.h"
#include "hp/comm/collective_log.h"

namespace hp {
class ClusterTopology;
}
namespace hp::symm {
class Heap;
}

namespace hp::comm {

class Engine;
class Group;
// Makes (or finds) the group of some global ranks: World::group.
using GroupMaker = std::function<std::shared_ptr<Group>(const std::vector<int>& ranks)>;

// How a group that spans hosts splits for the hierarchical collectives: this rank's host
// (`inner`, shared memory) and the ranks of the same local index on every host (`outer`).
struct HostLevels {
  int hosts = 0;
  int per_host = 0;
  int host = 0;   // this rank's host block: group ranks [host * per_host, (host + 1) * per_host)
  int local = 0;  // this rank's index inside it
  std::shared_ptr<Group> inner, outer;
};

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

  // The group's symmetric heap (hp/comm/symm), created on first use: a collective call,
  // so every member must reach it at the same point of its sequence of collectives.
  std::shared_ptr<symm::Heap> symm_heap() const;

  // A flat buffer of `numel` elements for a collective's output or staging. Buffers are
  // pooled and handed out again once nobody else holds their storage, so steady-state
  // training touches no fresh pages (first-touch page faults cost more than the copies).
  // A fake group allocates afresh: a dry-run counts what a device's runtime would hold.
  at::Tensor buffer(int64_t numel, const at::TensorOptions& options) const;

  // Where the world's ranks run (level 0 of the topology is the host; global ranks are its
  // devices) and how to make groups of some of them: given by World. Null topology: unknown.
  void set_hosts(std::shared_ptr<const ClusterTopology> topology, GroupMaker make_group);
  const ClusterTopology* topology() const { return topology_.get(); }
  // The group split into hosts, created on first use: a collective call (it creates the
  // inner group, then the outer one, on every member in the same order). Throws unless
  // the ranks form equal consecutive blocks on 2 or more hosts (hp/topology/hierarchical.h).
  const HostLevels& host_levels() const;

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
  mutable std::mutex heap_mu_;
  mutable std::shared_ptr<symm::Heap> heap_;
  mutable std::mutex pool_mu_;
  mutable std::vector<at::Tensor> pool_;
  std::shared_ptr<const ClusterTopology> topology_;
  GroupMaker make_group_;
  mutable std::mutex levels_mu_;
  mutable std::unique_ptr<HostLevels> levels_;
};

}  // namespace hp::comm
