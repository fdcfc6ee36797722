// DTensor creation, redistribution and gradients over random layouts (1-D to 3-D meshes,
// uneven shapes), ranks as threads.
#include <gtest/gtest.h>

#include "check.h"

using namespace hp;
using namespace hp::testing;

namespace {

struct MeshCase {
  std::vector<int64_t> shape;
  int pairs;
};

void check_random_pairs(const MeshCase& mc, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : mc.shape) n *= d;
  comm::run_local_ranks(static_cast<int>(n), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", mc.shape);
    std::mt19937 rng(seed);  // same on every rank: same cases
    for (int c = 0; c < mc.pairs; ++c) {
      std::uniform_int_distribution<int> nd_pick(1, 3), len(1, 7);
      const int nd = nd_pick(rng);
      std::vector<int64_t> shape;
      for (int d = 0; d < nd; ++d) shape.push_back(len(rng));
      auto a = random_placements(rng, mesh.ndim(), nd);
      auto b = random_placements(rng, mesh.ndim(), nd);
      manual_seed(c);
      at::Tensor full = hp::randn(shape, at::kDouble);
      SCOPED_TRACE("shape " + to_string_list(shape) + " " + to_string_list(a) + " -> " + to_string_list(b));

      DTensor x = distribute_tensor(full, mesh, a);
      ASSERT_TRUE(close(x.full_tensor(), full));
      x.requires_grad_(true);
      DTensor y = x.redistribute(b);
      if (!y.spec().has_partial())
        ASSERT_TRUE(at::equal(y.to_local(), local_piece(full, y.spec(), mesh.coordinate())));
      ASSERT_TRUE(close(y.full_tensor(), full));
      DTensor back = y.redistribute(a);
      ASSERT_TRUE(close(back.full_tensor(), full)) << "A -> B -> A is not the identity";
      // d/dT sum(T * W) = W, whatever the layouts on the way.
      at::Tensor w = hp::randn(shape, at::kDouble);
      (back.full_tensor() * w).sum().backward();
      ASSERT_TRUE(x.grad().has_value());
      ASSERT_TRUE(close(x.grad()->full_tensor(), w)) << "gradient did not come back in the input's layout";
    }
  });
}

}  // namespace

TEST(Redistribute, RandomPairsOneDimMesh2) { check_random_pairs({{2}, 40}, 1); }
TEST(Redistribute, RandomPairsOneDimMesh3) { check_random_pairs({{3}, 40}, 2); }
TEST(Redistribute, RandomPairsMesh2x2) { check_random_pairs({{2, 2}, 40}, 3); }
TEST(Redistribute, RandomPairsMesh2x2x2) { check_random_pairs({{2, 2, 2}, 15}, 4); }

TEST(DTensor, FromLocalAndDistributeFromSource) {
  comm::run_local_ranks(3, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {3}, {"tp"});
    // Uneven: 7 rows over 3 ranks are 3, 3, 1.
    at::Tensor full = at::arange(14, at::kDouble).reshape({7, 2});
    at::Tensor mine = full.narrow(0, rank * 3, rank == 2 ? 1 : 3);
    DTensor d = DTensor::from_local(mine, mesh, {Shard(0)}, std::vector<int64_t>{7, 2});
    EXPECT_TRUE(at::equal(d.full_tensor(), full));
    EXPECT_EQ(d.sizes(), (std::vector<int64_t>{7, 2}));
    // Even shards need no global shape.
    DTensor e = DTensor::from_local(at::ones({2, 4}), mesh, {Shard(1)});
    EXPECT_EQ(e.sizes(), (std::vector<int64_t>{2, 12}));
    // Only rank 1 has the data.
    DTensor s = distribute_tensor(rank == 1 ? full : at::Tensor(), mesh, {Shard(1)}, /*src_rank=*/1);
    EXPECT_TRUE(at::equal(s.full_tensor(), full));
    std::ostringstream os;
    os << s;
    EXPECT_NE(os.str().find("placements [S(1)]"), std::string::npos) << os.str();
  });
}

TEST(DTensor, ErrorsNameBothSides) {
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    try {
      DTensor::from_local(at::ones({rank + 2, 2}), mesh, {Shard(0)}, std::vector<int64_t>{4, 2});
      if (rank == 1) ADD_FAILURE() << "no error";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds a local tensor of shape"), std::string::npos) << e.what();
    }
    DTensor a = distribute_tensor(at::ones({4, 2}), mesh, {Shard(0)});
    DTensor b = distribute_tensor(at::ones({4, 2}, at::kDouble), mesh, {Shard(0)});
    try {
      add(a, b);
      ADD_FAILURE() << "no error";
    } catch (const hp::Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("Float"), std::string::npos) << m;
      EXPECT_NE(m.find("Double"), std::string::npos) << m;
    }
    EXPECT_THROW(distribute_tensor(at::ones({4}), mesh, {Shard(0), Shard(0)}), hp::Error);
    EXPECT_THROW(matmul(distribute_tensor(at::ones({4, 3}), mesh, {Shard(0)}),
                        distribute_tensor(at::ones({4, 3}), mesh, {Shard(0)})),
                 hp::Error);
  });
}
