#include <gtest/gtest.h>

#include <unordered_set>

#include "hp/base/error.h"
#include "hp/layout/shard_spec.h"

using namespace hp;
using V = std::vector<int64_t>;

TEST(ShardSpec, ChunksLikePyTorch) {
  auto sizes = [](int64_t n, int64_t k) {
    V s;
    for (int64_t i = 0; i < k; ++i) s.push_back(chunk_range(n, k, i).size);
    return s;
  };
  EXPECT_EQ(sizes(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(sizes(10, 4), (V{3, 3, 3, 1}));
  EXPECT_EQ(sizes(5, 4), (V{2, 2, 1, 0}));
  EXPECT_EQ(sizes(3, 4), (V{1, 1, 1, 0}));
  EXPECT_EQ(sizes(0, 3), (V{0, 0, 0}));
  EXPECT_EQ(chunk_range(5, 4, 3).offset, 5);  // empty trailing chunk sits at the end
}

TEST(ShardSpec, LocalShapesAndOffsets) {
  ShardSpec s({10, 6}, 4, MeshShape({4, 2}, {"dp", "tp"}), {Shard(0), Shard(1)});
  EXPECT_EQ(s.local_shape({3, 1}), (V{1, 3}));
  EXPECT_EQ(s.global_offset({3, 1}), (V{9, 3}));
  EXPECT_EQ(s.local_bytes({0, 0}), 3 * 3 * 4);
  EXPECT_EQ(s.local_shape_of_rank(7), (V{1, 3}));
  EXPECT_EQ(s.max_local_bytes(), 36);
  EXPECT_EQ(s.mesh_dims_sharding(1), (std::vector<int>{1}));
}

TEST(ShardSpec, SeveralMeshDimsSplitOneTensorDimOuterFirst) {
  // 7 rows: mesh dim 0 gives [4, 3], then mesh dim 1 splits each piece 3 ways.
  ShardSpec s({7}, 1, MeshShape({2, 3}), {Shard(0), Shard(0)});
  V sizes, offsets;
  for (int r = 0; r < 6; ++r) {
    sizes.push_back(s.local_shape_of_rank(r)[0]);
    offsets.push_back(s.global_offset_of_rank(r)[0]);
  }
  EXPECT_EQ(sizes, (V{2, 2, 0, 1, 1, 1}));
  EXPECT_EQ(offsets, (V{0, 2, 4, 4, 5, 6}));
}

TEST(ShardSpec, NegativeDimsNormalise) {
  ShardSpec a({4, 6}, 2, MeshShape({2}), {Shard(-1)});
  EXPECT_EQ(a.placement(0), Shard(1));
  EXPECT_EQ(a, ShardSpec({4, 6}, 2, MeshShape({2}), {Shard(1)}));
}

// Every element is held by exactly one rank of each replica set, for all layouts.
TEST(ShardSpec, ShardsTileTheTensorExactlyOnce) {
  std::vector<MeshShape> meshes{MeshShape({3}), MeshShape({2, 3}), MeshShape({2, 2, 2}),
                                MeshShape({4, 3})};
  std::vector<V> shapes{{0}, {1}, {5}, {7, 3}, {3, 5, 2}, {2, 0, 4}};
  int checked = 0;
  for (const auto& mesh : meshes)
    for (const auto& shape : shapes) {
      std::vector<Placement> opts{Replicate()};
      for (int t = 0; t < static_cast<int>(shape.size()); ++t) opts.push_back(Shard(t));
      int64_t combos = 1;
      for (int d = 0; d < mesh.ndim(); ++d) combos *= static_cast<int64_t>(opts.size());
      for (int64_t c = 0; c < combos; ++c) {
        std::vector<Placement> ps;
        for (int64_t x = c, d = 0; d < mesh.ndim(); ++d, x /= opts.size()) ps.push_back(opts[x % opts.size()]);
        ShardSpec s(shape, 8, mesh, ps);
        int64_t n = s.numel(), replicas = 1;
        for (int d = 0; d < mesh.ndim(); ++d)
          if (!ps[d].is_shard()) replicas *= mesh.dim_size(d);
        std::vector<int64_t> count(n, 0);
        int64_t held = 0;
        for (int r : mesh.ranks()) {
          V off = s.global_offset_of_rank(r), ls = s.local_shape_of_rank(r);
          int64_t ln = 1;
          for (size_t i = 0; i < ls.size(); ++i) {
            ASSERT_GE(off[i], 0);
            ASSERT_LE(off[i] + ls[i], shape[i]) << s << " rank " << r;
            ln *= ls[i];
          }
          held += ln;
          ASSERT_EQ(s.local_bytes_of_rank(r), ln * 8);
          ASSERT_LE(s.local_bytes_of_rank(r), s.max_local_bytes());
          // Mark the box.
          V idx(ls.size(), 0);
          for (int64_t e = 0; e < ln; ++e) {
            int64_t f = 0;
            for (size_t i = 0; i < ls.size(); ++i) f = f * shape[i] + off[i] + idx[i];
            count[f]++;
            for (int i = static_cast<int>(ls.size()) - 1; i >= 0 && ++idx[i] == ls[i]; --i) idx[i] = 0;
          }
        }
        EXPECT_EQ(held, n * replicas) << s;
        for (int64_t e = 0; e < n; ++e) ASSERT_EQ(count[e], replicas) << s << " element " << e;
        ++checked;
      }
    }
  EXPECT_EQ(checked, 302);
}

TEST(ShardSpec, EqualityAndHash) {
  MeshShape m({2, 2});
  ShardSpec a({4, 4}, 4, m, {Shard(0), Replicate()});
  ShardSpec b({4, 4}, 4, m, {Shard(0), Replicate()});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a, a.with_placements({Shard(1), Replicate()}));
  EXPECT_NE(a, ShardSpec({4, 4}, 2, m, {Shard(0), Replicate()}));
  EXPECT_NE(a, ShardSpec({4, 4}, 4, MeshShape({2, 2}, {}, {3, 2, 1, 0}), {Shard(0), Replicate()}));
  std::unordered_set<ShardSpec> set{a, b, a.with_placements({Partial(), Partial(ReduceOp::Avg)})};
  EXPECT_EQ(set.size(), 2u);
  EXPECT_EQ(a.to_string(), "[4, 4] x4B on (d0=2, d1=2): [S(0), R]");
}

TEST(ShardSpec, ErrorsNameShapeMeshAndPlacements) {
  MeshShape m({2, 2});
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e1 = message([&] { ShardSpec({4}, 4, m, {Shard(0)}); });
  EXPECT_NE(e1.find("one placement per mesh dim"), std::string::npos) << e1;
  EXPECT_NE(e1.find("[S(0)]"), std::string::npos) << e1;
  std::string e2 = message([&] { ShardSpec({4, 4}, 4, m, {Shard(2), Replicate()}); });
  EXPECT_NE(e2.find("tensor dim 2"), std::string::npos) << e2;
  EXPECT_NE(e2.find("[4, 4]"), std::string::npos) << e2;
  std::string e3 = message([&] { ShardSpec({4}, 4, m, {Partial(), Partial(ReduceOp::Max)}); });
  EXPECT_NE(e3.find("mix partial ops"), std::string::npos) << e3;
  EXPECT_THROW(ShardSpec({4}, 0, m, {Replicate(), Replicate()}), Error);
  EXPECT_THROW(ShardSpec({-1}, 4, m, {Replicate(), Replicate()}), Error);
  ShardSpec ok({4}, 4, m, {Partial(), Partial(ReduceOp::Avg)});  // sum and avg mix
  EXPECT_THROW(ok.local_shape({2, 0}), Error);
  EXPECT_THROW(ok.local_shape({0}), Error);
  EXPECT_THROW(ok.local_shape_of_rank(4), Error);
}
