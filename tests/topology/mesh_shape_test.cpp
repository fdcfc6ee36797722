#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/topology/mesh_shape.h"

using hp::MeshShape;

TEST(MeshShape, CoordinatesRoundTrip) {
  MeshShape m({2, 3, 2}, {"dp", "cp", "tp"});
  EXPECT_EQ(m.size(), 12);
  for (int r = 0; r < 12; ++r) EXPECT_EQ(m.rank_at(m.coord_of(r)), r);
  EXPECT_EQ(m.coord_of(7), (std::vector<int64_t>{1, 0, 1}));
}

TEST(MeshShape, GroupsAlongDims) {
  MeshShape m({2, 2}, {"dp", "tp"});
  EXPECT_EQ(m.group_along(3, {1}), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group_along(3, {0}), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.groups_along({0}), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(m.groups_along({0, 1}), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
}

TEST(MeshShape, SubmeshKeepsGlobalRanks) {
  MeshShape m({2, 3}, {"pp", "tp"}, {10, 11, 12, 13, 14, 15});
  MeshShape tp = m.submesh(14, {m.dim_index("tp")});
  EXPECT_EQ(tp.ranks(), (std::vector<int>{13, 14, 15}));
  EXPECT_EQ(tp.names()[0], "tp");
  EXPECT_EQ(m.flatten().names()[0], "pp_tp");
  EXPECT_EQ(m.flatten().size(), 6);
}

TEST(MeshShape, ErrorsNameTheProblem) {
  EXPECT_THROW(MeshShape({2, 2}, {"dp"}), hp::Error);
  EXPECT_THROW(MeshShape({2, 2}, {"a", "b"}, {0, 1, 2}), hp::Error);
  MeshShape m({4}, {"dp"});
  try {
    m.dim_index("tp");
    FAIL();
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no dim named 'tp'"), std::string::npos);
  }
  EXPECT_THROW(m.coord_of(9), hp::Error);
}
