#include "hp/comm/world.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <malloc.h>

#include <algorithm>
#include <cstdlib>

#include <thread>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/engine.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/net.h"
#include "hp/comm/store.h"

namespace hp::comm {
namespace {

std::mutex g_mu;
std::shared_ptr<World> g_world;
thread_local std::shared_ptr<World> t_world;

std::string group_key(const std::string& device, const std::vector<int>& ranks) {
  std::string k = "hp/group/" + device;
  for (int r : ranks) k += "/" + std::to_string(r);
  return k;
}

// `address`: where Gloo listens; `interface`, when set, names the interface instead.
BackendPtr make_backend(const std::string& device, const StorePtr& store, int rank, int size,
                        std::chrono::milliseconds timeout, const std::string& address,
                        const std::string& interface) {
  if (device == "cpu") {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(interface.empty() ? c10d::ProcessGroupGloo::createDeviceForHostname(address)
                                              : c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
  }
#ifdef USE_C10D_NCCL
  if (device == "cuda") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
  }
#endif
  HP_FAIL() << "no process-group backend for device '" << device
            << "' in this LibTorch build (cpu uses Gloo; cuda needs LibTorch with NCCL)";
  return {};
}

// Every rank announces itself, then waits until all have; on timeout names the missing.
void wait_for_all_ranks(c10d::Store& store, const DistEnv& env, std::chrono::milliseconds timeout) {
  store.set("hp/joined/" + std::to_string(env.rank), std::vector<uint8_t>{1});
  store.add("hp/joined", 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store.add("hp/joined", 0) < env.world_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<int> missing;
      for (int r = 0; r < env.world_size; ++r)
        if (!store.check({"hp/joined/" + std::to_string(r)})) missing.push_back(r);
      HP_FAIL() << "rank " << env.rank << ": only " << env.world_size - missing.size() << " of "
                << env.world_size << " ranks joined within " << env.timeout_s
                << " s (HP_TIMEOUT_S); missing ranks " << to_string_list(missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

World::World(int rank, int size, StorePtr store, std::chrono::milliseconds timeout, bool loopback,
             DistEnv env, int ranks_per_host)
    : rank_(rank), size_(size), store_(std::move(store)), timeout_(timeout), loopback_(loopback),
      env_(std::move(env)), engine_(std::make_shared<Engine>("the progress engine of rank " + std::to_string(rank))) {
  // Communication buffers are large and short-lived. Served by mmap they are page-faulted
  // in afresh on every call (~12 us per 4 KiB page), which costs more than the copy
  // itself; from the heap they are reused.
  static std::once_flag process_tuned;
  std::call_once(process_tuned, [] {
    ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest glibc accepts
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
    // PyTorch's flight recorder (a trace of every c10d call, one for the whole process)
    // crashes a process that has made and dropped many Gloo groups, and hp names late
    // ranks itself: off unless asked for. It reads the variable when the first group is made.
    if (!std::getenv("TORCH_FR_BUFFER_SIZE") && !std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE"))
      ::setenv("TORCH_FR_BUFFER_SIZE", "0", 0);
  });
  HP_CHECK(size >= 1 && rank >= 0 && rank < size) << "rank " << rank << " outside world of " << size;
  ranks_per_host_ = ranks_per_host > 0 ? ranks_per_host : loopback ? size : std::max(1, env_.local_world_size);
  HP_CHECK(ranks_per_host_ >= 1 && ranks_per_host_ <= size)
      << "ranks per host must be in [1, " << size << "], got " << ranks_per_host_;
  topology_ = std::make_shared<ClusterTopology>(hier::host_topology(size, ranks_per_host_));
  gloo_address_ = "127.0.0.1";
  if (!loopback) {
    const char* iface = std::getenv("GLOO_SOCKET_IFNAME");  // PyTorch's name for the override
    if (iface && *iface) gloo_interface_ = iface;
    else gloo_address_ = local_address_towards(env_.master_addr, env_.master_port);
  }
}

World::~World() {
  // Before the groups go: queued jobs refer to them.
  if (engine_) engine_->shutdown();
}

std::shared_ptr<Group> World::group(const std::vector<int>& ranks, const std::string& device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(device, ranks);
  auto it = groups_.find(key);
  if (it != groups_.end()) return it->second;
  auto pos = std::find(ranks.begin(), ranks.end(), rank_);
  HP_CHECK(pos != ranks.end()) << "rank " << rank_ << " asked for group " << to_string_list(ranks)
                               << " but is not a member";
  for (int r : ranks)
    HP_CHECK(r >= 0 && r < size_) << "group " << to_string_list(ranks) << " names rank " << r
                                  << " outside the world of " << size_;
  int group_rank = static_cast<int>(pos - ranks.begin());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(group_key(device, ranks), store_);
  BackendPtr backend;
  try {
    backend = backend_factory_ ? backend_factory_(device, group_rank, static_cast<int>(ranks.size()))
                               : make_backend(device, prefixed, group_rank, static_cast<int>(ranks.size()), timeout_,
                                              gloo_address_, gloo_interface_);
  } catch (const hp::Error&) {
    throw;
  } catch (const std::exception& e) {
    HP_FAIL() << "rank " << rank_ << ": creating group " << to_string_list(ranks) << " on " << device
              << " failed (did every member create it, within " << timeout_.count() << " ms?): "
              << e.what();
  }
  auto g = std::make_shared<Group>(ranks, rank_, backend, timeout_, device, prefixed, on_one_host(ranks));
  g->set_log(log_);
  g->set_engine(engine_);
  // Sub-groups for the hierarchical collectives come from this world; a world not owned
  // by a shared_ptr has none to give, and its groups stay flat.
  std::weak_ptr<World> self = weak_from_this();
  if (!self.expired())
    g->set_hosts(topology_, [self, device](const std::vector<int>& sub) {
      auto w = self.lock();
      HP_CHECK(w) << "group " << to_string_list(sub) << ": the world that made its parent is gone";
      return w->group(sub, device);
    });
  groups_.emplace(key, g);
  return g;
}

bool World::on_one_host(const std::vector<int>& ranks) const {
  return std::all_of(ranks.begin(), ranks.end(), [&](int r) { return host_of(r) == host_of(ranks.front()); });
}

std::shared_ptr<Group> World::world_group(const std::string& device) {
  std::vector<int> all(size_);
  for (int r = 0; r < size_; ++r) all[r] = r;
  return group(all, device);
}

std::shared_ptr<World> init_distributed() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_world) return g_world;
  DistEnv env = read_dist_env();
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(env.timeout_s * 1000));
  StorePtr store;
  if (env.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    store = rendezvous_store(env, timeout);
    wait_for_all_ranks(*store, env, timeout);
  }
  bool loopback = env.local_world_size == env.world_size;
  // Hosts are told apart by rank / LOCAL_WORLD_SIZE: launchers number ranks node by node.
  HP_CHECK(loopback || env.node_rank == env.rank / env.local_world_size)
      << "rank " << env.rank << " with " << env.local_world_size << " ranks per node should be on node "
      << env.rank / env.local_world_size << " but the launcher says node " << env.node_rank
      << " (GROUP_RANK / NODE_RANK): ranks must be numbered node by node";
  g_world = std::make_shared<World>(env.rank, env.world_size, store, timeout, loopback, env);
  return g_world;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_world != nullptr || t_world != nullptr;
}

std::shared_ptr<World> current_world() {
  if (t_world) return t_world;
  std::lock_guard<std::mutex> lock(g_mu);
  HP_CHECK(g_world) << "no distributed world: call hp::init_distributed() first";
  return g_world;
}

ScopedWorld::ScopedWorld(std::shared_ptr<World> world) : previous_(std::move(t_world)) {
  t_world = std::move(world);
}

ScopedWorld::~ScopedWorld() { t_world = std::move(previous_); }

}  // namespace hp::comm
