// Hierarchical collectives (hp/comm/hier) on ranks as threads that declare hosts of their
// own (run_local_ranks' ranks_per_host): shared memory inside each "host", Gloo on
// loopback between. Each result is checked against the flat algorithm on the same group
// (hier::Mode::Off) and against a reference computed on every rank from all ranks' inputs.
// Small pieces (HP_HIER_PIECE_KIB) make messages take several; at that size the cost
// model would rather go flat, so the tests force the hierarchical path (Mode::On).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <numeric>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/net.h"
#include "rank_data.h"
#include "scoped_env.h"

using namespace hp;
using namespace hp::comm;

namespace {

// Runs `fn` on 2 hosts x 2 ranks (or as given) with 16 KiB pieces.
void on_hosts(int hosts, int per_host, const std::function<void(int rank, const Group& g)>& fn) {
  ScopedEnv pieces("HP_HIER_PIECE_KIB", "16");
  run_local_ranks(
      hosts * per_host, [&](int rank) { fn(rank, *current_world()->world_group()); }, std::chrono::seconds(60),
      per_host);
}

// `f` on `g` flat (Gloo) and hierarchical; checks that only the second took the hierarchical path.
template <typename F>
std::pair<at::Tensor, at::Tensor> flat_and_hier(F&& f) {
  at::Tensor flat;
  {
    hier::ScopedMode off(hier::Mode::Off);
    const int64_t before = hier::calls_on_this_thread();
    flat = f();
    EXPECT_EQ(hier::calls_on_this_thread(), before);
  }
  hier::ScopedMode on(hier::Mode::On);
  const int64_t before = hier::calls_on_this_thread();
  at::Tensor h = f();
  EXPECT_EQ(hier::calls_on_this_thread(), before + 1);
  return {flat, h};
}

at::Tensor input_sum(int n, at::IntArrayRef shape, at::ScalarType dtype) {
  at::Tensor s = at::zeros(shape, at::kDouble);
  for (int r = 0; r < n; ++r) s += rank_input(r, shape, dtype).to(at::kDouble);
  return s;
}

}  // namespace

TEST(HierCollectives, AllReduceEqualsFlatExactlyOnIntegers) {
  on_hosts(2, 2, [](int rank, const Group& g) {
    for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kBFloat16, at::kHalf}) {
      for (int64_t numel : {1, 7, 1000, 33333}) {  // 33333 floats: 9 pieces, uneven slices
        at::Tensor x = rank_input(rank, {numel}, dtype);
        auto [flat, h] = flat_and_hier([&] { return all_reduce(x, g); });
        ASSERT_TRUE(at::equal(h, flat)) << dtype << " numel " << numel;
        ASSERT_TRUE(at::equal(h, input_sum(4, {numel}, dtype).to(dtype))) << dtype << " numel " << numel;
      }
    }
    // Other ops, and a tensor that is not contiguous.
    at::Tensor x = rank_input(rank, {300, 40}, at::kFloat).t();
    for (auto op : {ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg, ReduceOp::Product}) {
      auto [flat, h] = flat_and_hier([&] { return all_reduce(x, g, op); });
      ASSERT_TRUE(at::equal(h, flat)) << "op " << int(op);
    }
    at::Tensor i = rank_input(rank, {5000}, at::kLong);
    auto [flat, h] = flat_and_hier([&] { return all_reduce(i, g, ReduceOp::Avg); });  // truncates once
    ASSERT_TRUE(at::equal(h, flat));
  });
}

TEST(HierCollectives, RandomFloatsCloseToFlatAndDeterministic) {
  on_hosts(2, 2, [](int rank, const Group& g) {
    at::manual_seed(100 + rank);
    at::Tensor x = at::randn({50001});
    auto [flat, h] = flat_and_hier([&] { return all_reduce(x, g); });
    // Four addends in another order: a few ulps of the sum at most.
    ASSERT_TRUE(at::allclose(h, flat, 1e-5, 1e-5)) << (h - flat).abs().max().item<float>();
    {
      hier::ScopedMode on(hier::Mode::On);
      ASSERT_TRUE(at::equal(h, all_reduce(x, g))) << "the same bits a second time";
    }
    hier::ScopedMode on(hier::Mode::On);
    at::Tensor rs = reduce_scatter(x.narrow(0, 0, 50000), g);
    ASSERT_TRUE(at::allclose(rs, h.narrow(0, rank * 12500, 12500), 1e-5, 1e-5));
    ASSERT_TRUE(at::equal(rs, reduce_scatter(x.narrow(0, 0, 50000), g)));
  });
}

TEST(HierCollectives, AllGatherUnevenEqualsFlat) {
  on_hosts(2, 2, [](int rank, const Group& g) {
    const std::vector<int64_t> sizes{3000, 0, 5111, 17};
    for (auto dtype : {at::kFloat, at::kLong, at::kBFloat16, at::kBool}) {
      for (int64_t dim : {0, 1}) {
        std::vector<int64_t> shape{7, 7};
        shape[dim] = sizes[rank];
        auto make = [&](int r) { return rank_input(r, shape, at::kInt, dim).remainder(dtype == at::kBool ? 2 : 100).to(dtype); };
        at::Tensor x = make(rank);
        auto [flat, h] = flat_and_hier([&] { return all_gather(x, g, dim, sizes); });
        ASSERT_TRUE(at::equal(h, flat)) << dtype << " dim " << dim;
        std::vector<at::Tensor> parts;
        for (int r = 0; r < 4; ++r) {
          shape[dim] = sizes[r];
          parts.push_back(make(r));
        }
        ASSERT_TRUE(at::equal(h, at::cat(parts, dim))) << dtype << " dim " << dim;
      }
    }
    at::Tensor even = rank_input(rank, {10000}, at::kFloat);
    auto [flat, h] = flat_and_hier([&] { return all_gather(even, g); });
    ASSERT_TRUE(at::equal(h, flat));
  });
}

TEST(HierCollectives, ReduceScatterUnevenEqualsFlat) {
  on_hosts(2, 2, [](int rank, const Group& g) {
    const std::vector<int64_t> sizes{4100, 1, 0, 2500};
    for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kBFloat16}) {
      for (int64_t dim : {0, 1}) {
        std::vector<int64_t> shape{5, 5};
        shape[dim] = 6601;
        at::Tensor x = rank_input(rank, shape, dtype);
        auto [flat, h] = flat_and_hier([&] { return reduce_scatter(x, g, dim, ReduceOp::Sum, sizes); });
        ASSERT_TRUE(at::equal(h, flat)) << dtype << " dim " << dim;
        const int64_t off = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
        ASSERT_TRUE(at::equal(h, input_sum(4, shape, dtype).to(dtype).narrow(dim, off, sizes[rank])));
      }
    }
    at::Tensor x = rank_input(rank, {4, 9000}, at::kInt);
    for (auto op : {ReduceOp::Max, ReduceOp::Avg}) {
      auto [flat, h] = flat_and_hier([&] { return reduce_scatter(x, g, 0, op); });
      ASSERT_TRUE(at::equal(h, flat)) << "op " << int(op);
    }
  });
}

TEST(HierCollectives, ThreeHostsAndFourPerHost) {
  for (auto layout : {std::pair{3, 2}, std::pair{2, 4}}) {
    const int hosts = layout.first, per_host = layout.second;
    on_hosts(hosts, per_host, [&](int rank, const Group& g) {
      const int n = hosts * per_host;
      at::Tensor x = rank_input(rank, {20000}, at::kFloat);
      auto [flat, h] = flat_and_hier([&] { return all_reduce(x, g); });
      ASSERT_TRUE(at::equal(h, flat));
      ASSERT_TRUE(at::equal(h, input_sum(n, {20000}, at::kFloat).to(at::kFloat)));
      std::vector<int64_t> sizes(n);
      for (int r = 0; r < n; ++r) sizes[r] = 1000 + r;
      auto [fg, hg] = flat_and_hier([&] { return all_gather(x.narrow(0, 0, sizes[rank]), g, 0, sizes); });
      ASSERT_TRUE(at::equal(hg, fg));
      auto [fr, hr] = flat_and_hier([&] { return reduce_scatter(x, g); });
      ASSERT_TRUE(at::equal(hr, fr));
    });
  }
}

TEST(HierCollectives, FlatWhereTheLayoutDoesNotFit) {
  on_hosts(2, 2, [](int rank, const Group& world) {
    hier::ScopedMode on(hier::Mode::On);
    const int64_t before = hier::calls_on_this_thread();
    // Hosts' ranks not consecutive in the group; one rank per host; one host only.
    auto mixed = current_world()->group({0, 2, 1, 3});
    auto across = current_world()->group({rank % 2, rank % 2 + 2});
    auto inside = current_world()->group({rank / 2 * 2, rank / 2 * 2 + 1});
    at::Tensor x = rank_input(rank, {5000}, at::kFloat);
    ASSERT_TRUE(at::equal(all_reduce(x, *mixed), input_sum(4, {5000}, at::kFloat).to(at::kFloat)));
    all_reduce(x, *across);
    all_reduce(x, *inside);
    EXPECT_EQ(hier::calls_on_this_thread(), before);
    all_reduce(x, world);
    EXPECT_EQ(hier::calls_on_this_thread(), before + 1);
    // Left to the cost model, a one-piece message goes hierarchical: fewer network hops.
    hier::ScopedMode automatic(hier::Mode::Auto);
    all_reduce(x.narrow(0, 0, 1000), world);
    EXPECT_EQ(hier::calls_on_this_thread(), before + 2);
  });
}

TEST(HierHosts, WorldKnowsItsHostsAndGlooAddress) {
  EXPECT_EQ(local_address_towards("127.0.0.1", 29500), "127.0.0.1");
  run_local_ranks(
      4,
      [](int rank) {
        auto w = current_world();
        EXPECT_EQ(w->ranks_per_host(), 2);
        EXPECT_EQ(w->host_of(rank), rank / 2);
        EXPECT_TRUE(w->on_one_host({2, 3}));
        EXPECT_FALSE(w->on_one_host({1, 2}));
        EXPECT_EQ(w->gloo_address(), "127.0.0.1");  // ranks as threads stay on loopback
      },
      std::chrono::seconds(60), 2);
}
