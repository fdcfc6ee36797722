#include <gtest/gtest.h>

#include "hp/base/error.h"
#include "hp/plan/rank_correlation.h"

using namespace hp::plan;

TEST(RankCorrelation, TiesShareTheMeanRank) {
  EXPECT_EQ(ranks_of({30, 10, 20, 10}), (std::vector<double>{4, 1.5, 3, 1.5}));
}

TEST(RankCorrelation, SameOrderReverseOrderAndOneSwap) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4, 5}, {10, 20, 35, 40, 90}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4, 5}, {5, 4, 3, 2, 1}), -1.0);
  // One adjacent swap among five: 1 - 6 * 2 / (5 * 24) = 0.9.
  EXPECT_NEAR(spearman({1, 2, 3, 4, 5}, {1, 3, 2, 4, 5}), 0.9, 1e-12);
}

TEST(RankCorrelation, RejectsSeriesWithoutARanking) {
  EXPECT_THROW(spearman({1}, {1}), hp::Error);
  EXPECT_THROW(spearman({1, 2}, {1, 2, 3}), hp::Error);
  EXPECT_THROW(spearman({1, 1, 1}, {1, 2, 3}), hp::Error);
}
