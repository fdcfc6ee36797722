// Each collective against the reference arithmetic, world sizes 1 to 4 (3: uneven),
// dtypes float32, float16, bfloat16, float64, int32, int64; ranks are threads on one host,
// so collectives go through shared memory, and through real Gloo when it is switched off
// (HP_SHM_COLLECTIVES=0, the cases named *_gloo).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "rank_data.h"
#include "scoped_env.h"

using namespace hp;
using namespace hp::comm;

namespace {

struct Case {
  int world;
  at::ScalarType dtype;
  bool shm = true;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return "w" + std::to_string(info.param.world) + "_" + std::string(c10::toString(info.param.dtype)) +
         (info.param.shm ? "" : "_gloo");
}

class Collectives : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ::setenv("HP_SHM_COLLECTIVES", GetParam().shm ? "1" : "0", 1); }
  void TearDown() override { ::unsetenv("HP_SHM_COLLECTIVES"); }
};

// The path the collectives of `g` take is the one the case asks for.
void expect_path(const Group& g, bool shm) {
  EXPECT_EQ(symm::shm_collectives_enabled(g), shm && g.size() > 1) << g.describe();
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_TRUE(at::equal(got, want)) << what << "\n got " << got << "\n want " << want;
}

// The reference reduction of every rank's input, computed in double then cast.
at::Tensor reference_reduce(int world, at::IntArrayRef shape, at::ScalarType dtype, ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(rank_input(r, shape, dtype).to(at::kDouble));
  at::Tensor s = at::stack(all);
  at::Tensor out;
  switch (op) {
    case ReduceOp::Sum: out = s.sum(0); break;
    case ReduceOp::Avg:
      out = s.sum(0) / world;
      if (dtype == at::kLong) out = s.sum(0).div(world, "trunc");
      break;
    case ReduceOp::Max: out = std::get<0>(s.max(0)); break;
    case ReduceOp::Min: out = std::get<0>(s.min(0)); break;
    case ReduceOp::Product: out = s.prod(0); break;
  }
  return out.to(dtype);
}

TEST_P(Collectives, AllReduceEveryOp) {
  auto [world, dtype, shm] = GetParam();
  run_local_ranks(world, [&](int rank) {
    auto g = current_world()->world_group();
    expect_path(*g, shm);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
      at::Tensor x = rank_input(rank, {3, 5}, dtype);
      all_reduce_(x, *g, op);
      expect_equal(x, reference_reduce(world, {3, 5}, dtype, op), std::string("all_reduce ") + to_string(op));
    }
    // Non-contiguous input is reduced in place too.
    at::Tensor y = rank_input(rank, {5, 3}, dtype).t();
    all_reduce_(y, *g);
    expect_equal(y, reference_reduce(world, {5, 3}, dtype, ReduceOp::Sum).t(), "all_reduce transposed");
  });
}

TEST_P(Collectives, AllGatherUnevenAnyDim) {
  auto [world, dtype, shm] = GetParam();
  run_local_ranks(world, [&](int rank) {
    auto g = current_world()->world_group();
    expect_path(*g, shm);
    for (int64_t dim : {0, 1, -1}) {
      std::vector<int64_t> sizes;
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) {
        sizes.push_back(r + 1);  // uneven: rank r holds r + 1 rows
        std::vector<int64_t> shape{4, 3, 2};
        shape[dim < 0 ? dim + 3 : dim] = r + 1;
        parts.push_back(rank_input(r, shape, dtype));
      }
      at::Tensor got = all_gather(parts[rank], *g, dim, sizes);
      expect_equal(got, at::cat(parts, dim), "all_gather dim " + std::to_string(dim));
    }
    // Equal sizes need no size list.
    at::Tensor mine = rank_input(rank, {2, 3}, dtype);
    std::vector<at::Tensor> all;
    for (int r = 0; r < world; ++r) all.push_back(rank_input(r, {2, 3}, dtype));
    expect_equal(all_gather(mine, *g, 1), at::cat(all, 1), "all_gather equal");
  });
}

TEST_P(Collectives, ReduceScatterUnevenAnyDim) {
  auto [world, dtype, shm] = GetParam();
  run_local_ranks(world, [&](int rank) {
    auto g = current_world()->world_group();
    expect_path(*g, shm);
    for (int64_t dim : {0, 1}) {
      std::vector<int64_t> shape{7, 6};  // 7 rows: uneven over 2, 3 and 4 ranks
      shape[1] = dim == 1 ? 7 : 6;
      shape[0] = dim == 1 ? 4 : 7;
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
        at::Tensor got = reduce_scatter(rank_input(rank, shape, dtype), *g, dim, op);
        at::Tensor full = reference_reduce(world, shape, dtype, op);
        auto sizes = chunk_sizes(shape[dim], world);
        int64_t off = 0;
        for (int r = 0; r < rank; ++r) off += sizes[r];
        expect_equal(got, full.narrow(dim, off, sizes[rank]).contiguous(),
                     "reduce_scatter dim " + std::to_string(dim) + " " + to_string(op));
      }
    }
  });
}

TEST_P(Collectives, AllToAllEqualAndUneven) {
  auto [world, dtype, shm] = GetParam();
  run_local_ranks(world, [&](int rank) {
    auto g = current_world()->world_group();
    expect_path(*g, shm);
    // Uneven: rank r holds r + 2 columns and splits its 5 rows by chunk sizes.
    auto rows = chunk_sizes(5, world);
    std::vector<int64_t> cols;
    for (int r = 0; r < world; ++r) cols.push_back(r + 2);
    at::Tensor x = rank_input(rank, {5, cols[rank]}, dtype);
    at::Tensor got = all_to_all(x, *g, /*split_dim=*/0, /*concat_dim=*/1, rows, cols);
    std::vector<at::Tensor> parts;
    int64_t off = 0;
    for (int r = 0; r < rank; ++r) off += rows[r];
    for (int r = 0; r < world; ++r) parts.push_back(rank_input(r, {5, cols[r]}, dtype).narrow(0, off, rows[rank]));
    expect_equal(got, at::cat(parts, 1), "all_to_all 0->1 uneven");

    // Equal splits, split dim 1, concat dim 0 (the Shard(1) -> Shard(0) move).
    at::Tensor y = rank_input(rank, {2, 4 * world}, dtype);
    at::Tensor moved = all_to_all(y, *g, 1, 0);
    std::vector<at::Tensor> want;
    for (int r = 0; r < world; ++r) want.push_back(rank_input(r, {2, 4 * world}, dtype).narrow(1, 4 * rank, 4));
    expect_equal(moved, at::cat(want, 0), "all_to_all 1->0");
  });
}

TEST_P(Collectives, BroadcastSendRecvBarrier) {
  auto [world, dtype, shm] = GetParam();
  run_local_ranks(world, [&](int rank) {
    auto g = current_world()->world_group();
    expect_path(*g, shm);
    const int src = world - 1;
    at::Tensor x = rank_input(rank, {3, 4}, dtype);
    broadcast_(x, *g, src);
    expect_equal(x, rank_input(src, {3, 4}, dtype), "broadcast");
    if (world > 1) {
      // A ring: send to the next rank, receive from the previous, both in flight at once.
      at::Tensor in = at::empty({2, 3}, at::TensorOptions().dtype(dtype));
      Pending r = recv_async(in, *g, (rank + world - 1) % world, 7);
      Pending s = send_async(rank_input(rank, {2, 3}, dtype), *g, (rank + 1) % world, 7);
      s.wait();
      expect_equal(r.wait(), rank_input((rank + world - 1) % world, {2, 3}, dtype), "recv");
    }
    barrier(*g);
  });
}

TEST_P(Collectives, AsyncHandlesOverlap) {
  auto [world, dtype, shm] = GetParam();
  run_local_ranks(world, [&](int rank) {
    auto g = current_world()->world_group();
    expect_path(*g, shm);
    // Both in flight at once, with buffers of the same size and dtype: neither may write
    // over the other's.
    Pending a = all_gather_async(rank_input(rank, {2, 2}, dtype), *g);
    Pending b = reduce_scatter_async(rank_input(rank, {world * 2, 2}, dtype), *g);
    at::Tensor ga = a.wait(), gb = b.wait();
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(rank_input(r, {2, 2}, dtype));
    expect_equal(ga, at::cat(parts, 0), "all_gather in flight beside a reduce_scatter");
    expect_equal(gb, reference_reduce(world, {world * 2, 2}, dtype, ReduceOp::Sum).narrow(0, 2 * rank, 2).contiguous(),
                 "reduce_scatter in flight beside an all_gather");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, Collectives,
                         testing::Values(Case{1, at::kFloat}, Case{2, at::kFloat}, Case{3, at::kFloat},
                                         Case{4, at::kFloat}, Case{2, at::kBFloat16}, Case{3, at::kBFloat16},
                                         Case{4, at::kBFloat16}, Case{2, at::kHalf}, Case{4, at::kHalf},
                                         Case{2, at::kDouble}, Case{3, at::kDouble}, Case{4, at::kLong},
                                         Case{3, at::kLong}, Case{1, at::kLong}, Case{3, at::kInt},
                                         Case{4, at::kInt}, Case{4, at::kFloat, false},
                                         Case{3, at::kBFloat16, false}, Case{2, at::kLong, false}),
                         case_name);

TEST(CollectiveErrors, NameTheGroupAndSizes) {
  run_local_ranks(2, [&](int rank) {
    auto g = current_world()->world_group();
    try {
      all_gather(at::ones({2}), *g, 0, {2, 2, 2});
      ADD_FAILURE() << "no error";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("all_gather on group [0, 1]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(reduce_scatter(at::ones({3}), *g, 0, ReduceOp::Sum, {1, 1}), hp::Error);
    EXPECT_THROW(all_gather(at::ones({}), *g, 0), hp::Error);
  });
}

TEST(CollectiveErrors, AbsentPeerTimesOutNamingTheOp) {
  // Rank 1 never joins the all-reduce: rank 0 must fail within the timeout, not hang.
  try {
    run_local_ranks(
        2,
        [&](int rank) {
          auto g = current_world()->world_group();
          if (rank == 0) all_reduce_(at::ones({4}), *g);
        },
        std::chrono::milliseconds(1500));
    FAIL() << "no error";
  } catch (const hp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("all_reduce on group [0, 1]"), std::string::npos) << m;
  }
}

}  // namespace

TEST(CollectiveLifetime, ManyGlooWorldsInOneProcess) {
  // A long-lived process creates and drops many groups (here: 200 worlds of 4 ranks as
  // threads, Gloo only). PyTorch's flight recorder, shared by every group of the process,
  // crashed such a process after about 100 of them; hp turns it off unless
  // TORCH_FR_BUFFER_SIZE is set.
  ScopedEnv gloo_only("HP_SHM_COLLECTIVES", "0");
  for (int round = 0; round < 200; ++round)
    run_local_ranks(4, [&](int rank) {
      auto g = current_world()->world_group();
      at::Tensor sum = all_reduce(at::ones({8}), *g);
      at::Tensor all = all_gather(at::full({2}, double(rank)), *g);
      ASSERT_TRUE(at::equal(sum, at::full({8}, 4.0))) << "round " << round;
      ASSERT_EQ(all.size(0), 8) << "round " << round;
    });
}
