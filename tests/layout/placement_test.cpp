#include <gtest/gtest.h>

#include <unordered_set>

#include "hp/base/error.h"
#include "hp/layout/placement.h"

using namespace hp;

TEST(Placement, KindsAndNames) {
  EXPECT_EQ(Shard(0).to_string(), "S(0)");
  EXPECT_EQ(Replicate().to_string(), "R");
  EXPECT_EQ(Partial().to_string(), "P(sum)");
  EXPECT_EQ(Partial(ReduceOp::Avg).to_string(), "P(avg)");
  EXPECT_EQ(Partial(ReduceOp::Max).to_string(), "P(max)");
  EXPECT_EQ(Partial(ReduceOp::Min).to_string(), "P(min)");
  EXPECT_TRUE(Shard(2).is_shard(2));
  EXPECT_FALSE(Shard(2).is_shard(1));
  EXPECT_EQ(Shard(2).dim(), 2);
  EXPECT_EQ(Partial(ReduceOp::Max).op(), ReduceOp::Max);
  EXPECT_TRUE(Placement().is_replicate());
}

TEST(Placement, EqualityAndHash) {
  EXPECT_EQ(Shard(1), Shard(1));
  EXPECT_NE(Shard(1), Shard(0));
  EXPECT_NE(Partial(ReduceOp::Sum), Partial(ReduceOp::Avg));
  EXPECT_NE(Replicate(), Partial());
  std::unordered_set<Placement> set{Shard(0), Shard(1), Replicate(), Partial(), Partial(ReduceOp::Min),
                                    Shard(0), Replicate()};
  EXPECT_EQ(set.size(), 5u);
}

TEST(Placement, ErrorsNameTheProblem) {
  try {
    Partial(ReduceOp::Product);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("product"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Replicate().dim(), Error);
  EXPECT_THROW(Shard(0).op(), Error);
}
