// Asynchronous collectives on the progress engine (hp/comm/engine.h), ranks as threads.
//
// Reference: the same collective called synchronously on the same inputs, after the
// asynchronous ones; results must be bitwise equal (tolerance 0: the engine runs the same
// algorithm in the same reduction order). Each configuration is one line: world size,
// ranks per emulated host (0: one host, shared memory; 2: hierarchical across hosts),
// dtype. Also: an asynchronous call returns before its peers have joined it (progress is
// off the calling thread), synchronous calls run after the pending ones, handles waited
// out of order, a late peer named through the handle, and shutdown with collectives in
// flight.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <optional>
#include <chrono>
#include <thread>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/transport.h"
#include "rank_data.h"
#include "scoped_env.h"

using namespace hp;
using namespace hp::comm;

namespace {

struct Config {
  int world;
  int per_host;  // 0: one host
  at::ScalarType dtype;
};

void PrintTo(const Config& c, std::ostream* os) {
  *os << "world " << c.world << ", " << c.per_host << " per host, " << c10::toString(c.dtype);
}

std::string config_name(const testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return "w" + std::to_string(c.world) + (c.per_host ? "_hosts_of_" + std::to_string(c.per_host) : "") + "_" +
         std::string(c10::toString(c.dtype));
}

class AsyncCollectives : public testing::TestWithParam<Config> {};

// Waits until `flag` is set, failing after `limit` instead of hanging.
void await(const std::atomic<bool>& flag, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!flag.load()) {
    HP_CHECK(std::chrono::steady_clock::now() < end) << "the peer's asynchronous call never returned";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_P(AsyncCollectives, EqualSynchronousBitwiseWaitedOutOfOrder) {
  const Config c = GetParam();
  ScopedEnv pieces("HP_HIER_PIECE_KIB", "16");  // several pieces per hierarchical message
  run_local_ranks(
      c.world,
      [&](int rank) {
        std::optional<hier::ScopedMode> on;
        if (c.per_host) on.emplace(hier::Mode::On);
        const Group& g = *current_world()->world_group();
        const Collective kinds[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter};
        for (Collective k : kinds)
          ASSERT_EQ(choose_transport(g, k, 1 << 20, c.dtype),
                    c.per_host ? Transport::Hierarchical : Transport::SharedMemory);
        // Uneven extents: 3 ranks split 1001 rows unevenly, gathers of different sizes per rank.
        at::Tensor a = rank_input(rank, {1001, 9}, c.dtype);
        at::Tensor b = rank_input(rank, {rank + 5, 7}, c.dtype, 1);
        std::vector<int64_t> b_sizes;
        for (int r = 0; r < c.world; ++r) b_sizes.push_back(r + 5);
        at::Tensor d = rank_input(rank, {4 * c.world, 33}, c.dtype, 2);
        at::Tensor e = rank_input(rank, {70000}, c.dtype, 3);  // large: the in-heap and staged paths

        at::Tensor a_async = a.clone(), e_async = e.clone();
        Pending pa = all_reduce_async(a_async, g);
        Pending pb = all_gather_async(b, g, 0, b_sizes);
        Pending pc = reduce_scatter_async(a, g, 0);
        Pending pd = all_to_all_async(d, g, 0, 1);
        Pending pe = broadcast_async(e_async, g, c.world - 1);
        Pending pf = all_reduce_async(e_async, g, ReduceOp::Max);  // in order after the broadcast
        // Waited in another order than issued.
        at::Tensor rf = pf.wait(), rc = pc.wait(), ra = pa.wait(), rd = pd.wait(), rb = pb.wait();
        pe.wait();

        EXPECT_TRUE(at::equal(ra, all_reduce(a, g)));
        EXPECT_TRUE(at::equal(rb, all_gather(b, g, 0, b_sizes)));
        EXPECT_TRUE(at::equal(rc, reduce_scatter(a, g, 0)));
        EXPECT_TRUE(at::equal(rd, all_to_all(d, g, 0, 1)));
        at::Tensor e_sync = e.clone();
        broadcast_(e_sync, g, c.world - 1);
        EXPECT_TRUE(at::equal(rf, all_reduce(e_sync, g, ReduceOp::Max)));
        EXPECT_TRUE(at::equal(rf, e_async));
      },
      std::chrono::seconds(60), c.per_host);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AsyncCollectives,
    testing::Values(Config{2, 0, at::kFloat},     //
                    Config{3, 0, at::kFloat},     // uneven
                    Config{4, 0, at::kBFloat16},  //
                    Config{3, 0, at::kLong},      //
                    Config{4, 2, at::kFloat},     // hierarchical, 2 hosts x 2
                    Config{6, 3, at::kDouble}),   // hierarchical, 2 hosts x 3
    config_name);

// Rank 0's asynchronous all-reduce must return before any peer has issued its own: the
// peers wait for that. Were the call run on rank 0's thread, it would wait for them and
// time out instead.
TEST(AsyncProgress, ReturnsBeforePeersJoin) {
  for (int per_host : {0, 2}) {
    std::atomic<bool> issued{false};
    run_local_ranks(
        4,
        [&](int rank) {
          std::optional<hier::ScopedMode> on;
          if (per_host) on.emplace(hier::Mode::On);
          const Group& g = *current_world()->world_group();
          at::Tensor x = rank_input(rank, {5000}, at::kFloat);
          at::Tensor expected = all_reduce(x, g);  // also creates the heap: not part of the test
          at::Tensor y = x.clone();
          if (rank == 0) {
            Pending p = all_reduce_async(y, g);
            issued = true;
            p.wait();
          } else {
            await(issued, std::chrono::seconds(20));
            all_reduce_(y, g);
          }
          EXPECT_TRUE(at::equal(y, expected)) << "per_host " << per_host;
        },
        std::chrono::seconds(10), per_host);
  }
}

// HP_ASYNC_COLLECTIVES=0 runs every asynchronous call to completion before it returns,
// Gloo's too (which otherwise progress on Gloo's threads): the baseline without overlap.
// Rank 1 joins late, so a call that returned early would not be ready.
TEST(AsyncProgress, OffCompletesGlooCallsOnTheCaller) {
  ScopedEnv off("HP_ASYNC_COLLECTIVES", "0");
  ScopedEnv gloo("HP_SHM_COLLECTIVES", "0");
  run_local_ranks(2, [&](int rank) {
    const Group& g = *current_world()->world_group();
    ASSERT_EQ(choose_transport(g, Collective::AllReduce, 4 * 1000, at::kFloat), Transport::Gloo);
    at::Tensor x = rank_input(rank, {1000}, at::kFloat);
    at::Tensor expected = all_reduce(x, g);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    at::Tensor y = x.clone();
    Pending p = all_reduce_async(y, g);
    EXPECT_TRUE(p.ready()) << "rank " << rank;
    EXPECT_TRUE(at::equal(y, expected)) << "rank " << rank;
    p.wait();
  });
}

// A synchronous call right after asynchronous ones, none waited yet, on the same group
// and on a sub-group (which a hierarchical call of the world uses too): it runs after
// them, so every rank pairs the same calls.
TEST(AsyncProgress, SynchronousCallsRunAfterPendingOnes) {
  for (int per_host : {0, 2}) {
    run_local_ranks(
        4,
        [&](int rank) {
          std::optional<hier::ScopedMode> on;
          if (per_host) on.emplace(hier::Mode::On);
          const Group& g = *current_world()->world_group();
          const Group& host = *current_world()->group(rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
          at::Tensor x = rank_input(rank, {30000}, at::kFloat), y = rank_input(rank, {3000}, at::kFloat, 1);
          at::Tensor x_ref = all_reduce(x, g), y_ref = all_reduce(y, host), z_ref = all_reduce(x, g, ReduceOp::Max);
          at::Tensor xa = x.clone(), za = x.clone();
          Pending p = all_reduce_async(xa, g);
          at::Tensor ys = all_reduce(y, host);  // sync on a sub-group while the world's is queued
          Pending q = all_reduce_async(za, g, ReduceOp::Max);
          at::Tensor xs = all_reduce(x, g);  // sync on the same group
          EXPECT_TRUE(at::equal(q.wait(), z_ref));
          EXPECT_TRUE(at::equal(p.wait(), x_ref));
          EXPECT_TRUE(at::equal(ys, y_ref));
          EXPECT_TRUE(at::equal(xs, x_ref));
        },
        std::chrono::seconds(10), per_host);
  }
}

// A peer that never joins: the handle's wait fails within the timeout, naming the op, the
// group and the late rank; later calls on this rank fail at once, naming the first failure.
TEST(AsyncProgress, LatePeerNamedThroughTheHandle) {
  run_local_ranks(
      3,
      [&](int rank) {
        const Group& g = *current_world()->world_group();
        at::Tensor x = rank_input(rank, {100}, at::kFloat);
        all_reduce_(x.clone(), g);  // the heap exists on every rank
        if (rank == 2) return;      // never joins the next one
        Pending p = all_reduce_async(x.clone(), g);
        try {
          p.wait();
          ADD_FAILURE() << "rank " << rank << ": wait returned without its peer";
        } catch (const Error& e) {
          const std::string m = e.what();
          EXPECT_TRUE(contains(m, "all_reduce on group [0, 1, 2]")) << m;
          EXPECT_TRUE(contains(m, "ranks [2] did not arrive")) << m;
        }
        try {
          all_reduce_(x.clone(), g);
          ADD_FAILURE() << "rank " << rank << ": a call after the failure ran";
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.what(), "earlier asynchronous collective")) << e.what();
        }
      },
      std::chrono::seconds(1));
}

// Ranks that return with collectives in flight, peers missing for some: the worlds shut
// their engines down (queued jobs cancelled, the running one bounded by the timeout).
TEST(AsyncProgress, ShutdownWithCollectivesInFlight) {
  run_local_ranks(
      2,
      [&](int rank) {
        const Group& g = *current_world()->world_group();
        std::vector<Pending> left;
        for (int i = 0; i < (rank == 0 ? 3 : 1); ++i)
          left.push_back(all_reduce_async(rank_input(rank, {20000}, at::kFloat), g));
      },
      std::chrono::seconds(1));
}
