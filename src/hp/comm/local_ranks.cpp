#include "hp/comm/local_ranks.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hp/base/error.h"
#include "hp/comm/world.h"

namespace hp::comm {

void run_local_ranks(int n, const std::function<void(int rank)>& fn, std::chrono::milliseconds timeout,
                     int ranks_per_host) {
  HP_CHECK(n >= 1) << "run_local_ranks needs at least one rank, got " << n;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  // A rank's world (its groups' connections) lives until every rank has returned: a rank
  // that finished first would otherwise close connections a peer is still setting up.
  std::mutex mu;
  std::condition_variable all_done;
  int running = n;
  auto finish = [&] {
    std::unique_lock<std::mutex> lock(mu);
    if (--running == 0) all_done.notify_all();
    all_done.wait(lock, [&] { return running == 0; });
  };
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<World> world;
      try {
        world = std::make_shared<World>(r, n, store, timeout, /*loopback=*/true, DistEnv{}, ranks_per_host);
        ScopedWorld scope(world);
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      finish();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) HP_CHECK(errors[r].empty()) << "rank " << r << ": " << errors[r];
}

}  // namespace hp::comm
