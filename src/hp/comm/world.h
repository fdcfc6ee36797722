// The job: this process's rank, the rendezvous store, and every process group it
// has joined (created once per (device, ranks) and cached).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hp/base/dist_env.h"
#include "hp/comm/backend.h"
#include "hp/comm/collective_log.h"
#include "hp/comm/group.h"
#include "hp/topology/cluster.h"

namespace hp::comm {

class World : public std::enable_shared_from_this<World> {
 public:
  // `loopback`: ranks all live on this host, so Gloo talks over 127.0.0.1; otherwise Gloo
  // listens on the interface that routes to MASTER_ADDR (or GLOO_SOCKET_IFNAME's).
  // Hosts are blocks of `ranks_per_host` consecutive ranks (0: all on one host when
  // `loopback`, else env.local_world_size per host, as launchers number them). Ranks as
  // threads may declare several hosts on loopback: tests of the hierarchical collectives.
  World(int rank, int size, StorePtr store, std::chrono::milliseconds timeout, bool loopback = true,
        DistEnv env = {}, int ranks_per_host = 0);
  ~World();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const DistEnv& env() const { return env_; }
  const StorePtr& store() const { return store_; }
  // Whether all of `ranks` run on one host.
  bool on_one_host(const std::vector<int>& ranks) const;
  int host_of(int rank) const { return rank / ranks_per_host_; }
  int ranks_per_host() const { return ranks_per_host_; }
  // Hosts (level 0, global ranks as devices) and the network between them, for the cost
  // model that picks each collective's algorithm (hp/comm/hier).
  const ClusterTopology& topology() const { return *topology_; }
  // The address Gloo listens on ("127.0.0.1" on loopback).
  const std::string& gloo_address() const { return gloo_address_; }

  // The group of `ranks` (this rank must be one). Every member must ask for the same
  // groups in the same order the first time: creating one is a rendezvous.
  std::shared_ptr<Group> group(const std::vector<int>& ranks, const std::string& device = "cpu");
  std::shared_ptr<Group> world_group(const std::string& device = "cpu");

  // Builds the backend of each group created from now on instead of Gloo/NCCL (a fake
  // world's). Arguments: device, this rank's index in the group, the group's size.
  using BackendFactory = std::function<BackendPtr(const std::string&, int, int)>;
  void set_backend_factory(BackendFactory f) { backend_factory_ = std::move(f); }

  // What this rank's collectives issued (recorded once enabled).
  CollectiveLog& collective_log() { return *log_; }

 private:
  int rank_;
  int size_;
  StorePtr store_;
  std::chrono::milliseconds timeout_;
  bool loopback_;
  DistEnv env_;
  BackendFactory backend_factory_;
  std::shared_ptr<CollectiveLog> log_ = std::make_shared<CollectiveLog>();
  // Runs this rank's asynchronous shared-memory and hierarchical collectives (engine.h).
  std::shared_ptr<Engine> engine_;
  int ranks_per_host_;
  std::shared_ptr<const ClusterTopology> topology_;
  std::string gloo_address_;
  std::string gloo_interface_;
  std::mutex mu_;
  std::map<std::pair<std::string, std::vector<int>>, std::shared_ptr<Group>> groups_;
};

// Joins the job described by the environment (hprun, torchrun, mpirun, Slurm; a single
// process when none is set): rendezvous through c10d's TCPStore, then checks that every
// rank arrived within HP_TIMEOUT_S, naming the missing ranks otherwise. Idempotent.
std::shared_ptr<World> init_distributed();
bool is_initialized();

// The world this thread works in: the one installed by ScopedWorld, else init_distributed's.
std::shared_ptr<World> current_world();

// Makes `world` current for this thread (ranks as threads in one process).
class ScopedWorld {
 public:
  explicit ScopedWorld(std::shared_ptr<World> world);
  ~ScopedWorld();
  ScopedWorld(const ScopedWorld&) = delete;
  ScopedWorld& operator=(const ScopedWorld&) = delete;

 private:
  std::shared_ptr<World> previous_;
};

}  // namespace hp::comm
