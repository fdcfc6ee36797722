// The fake backend: every collective completes at once on CPU and meta tensors, nothing
// bypasses it (no shared memory), and the collective log says what was issued, in order.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/comm/collectives.h"
#include "hp/comm/device_mesh.h"
#include "hp/comm/fake_backend.h"
#include "hp/comm/symm/heap.h"

using namespace hp;

TEST(FakeBackend, CollectivesCompleteAndAreLogged) {
  auto world = comm::fake_world(5, 8);
  comm::ScopedWorld scope(world);
  DeviceMesh mesh = init_device_mesh("meta", {4, 2}, {"dp", "tp"});
  const comm::Group& dp = mesh.group(0);
  const comm::Group& tp = mesh.group(1);
  EXPECT_EQ(dp.ranks(), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(tp.ranks(), (std::vector<int>{4, 5}));
  EXPECT_TRUE(dp.is_fake());
  EXPECT_FALSE(dp.on_one_host());  // no shared-memory path
  EXPECT_THROW(symm::group_heap(dp), std::exception);  // nor a symmetric heap

  auto meta = at::TensorOptions().device(at::kMeta);
  at::Tensor x = at::empty({6, 3}, meta);
  EXPECT_EQ(comm::all_gather(x, dp, 0).sizes(), (std::vector<int64_t>{24, 3}));
  EXPECT_EQ(comm::reduce_scatter(x, tp, 0).sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(comm::all_reduce(x.to(at::kBFloat16), dp).sizes(), x.sizes());
  EXPECT_EQ(comm::all_to_all(x, tp, 0, 1).sizes(), (std::vector<int64_t>{3, 6}));
  at::Tensor cpu = at::ones({4});  // CPU tensors work too: nothing moves
  comm::broadcast_(cpu, dp, 2);
  comm::send_async(cpu, tp, 0).wait();
  comm::recv_async(cpu, tp, 0).wait();
  comm::barrier(dp);
  comm::all_reduce(x, *world->group({5}, "meta"));  // one rank: nothing issued

  std::vector<comm::CollectiveRecord> want = {
      {"all_gather", {1, 3, 5, 7}, at::kFloat, 18},   {"reduce_scatter", {4, 5}, at::kFloat, 18},
      {"all_reduce", {1, 3, 5, 7}, at::kBFloat16, 18}, {"all_to_all", {4, 5}, at::kFloat, 18},
      {"broadcast", {1, 3, 5, 7}, at::kFloat, 4},     {"send", {4, 5}, at::kFloat, 4},
      {"recv", {4, 5}, at::kFloat, 4},                {"barrier", {1, 3, 5, 7}, at::kByte, 0}};
  auto got = world->collective_log().records();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << got[i].to_string();
  EXPECT_EQ(got[2].bytes(), 36);

  auto summary = comm::summarize(got);
  ASSERT_FALSE(summary.empty());
  EXPECT_EQ(summary[0].op, "all_gather");
  EXPECT_EQ(summary[0].group_size, 4);
  EXPECT_EQ(summary[0].bytes, 72);
}

TEST(FakeBackend, RankOutsideTheJobIsAnError) {
  EXPECT_THROW(comm::fake_world(8, 8), std::exception);
  EXPECT_THROW(comm::fake_world(0, 0), std::exception);
}
