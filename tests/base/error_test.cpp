#include <gtest/gtest.h>

#include "hp/base/error.h"

TEST(Error, CheckThrowsWithMessageAndPlace) {
  int a = 3, b = 4;
  try {
    HP_CHECK(a == b) << "a=" << a << " b=" << b;
    FAIL() << "no throw";
  } catch (const hp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("a=3 b=4"), std::string::npos) << m;
    EXPECT_NE(m.find("error_test.cpp"), std::string::npos) << m;
    EXPECT_NE(m.find("a == b"), std::string::npos) << m;
  }
}

TEST(Error, PassingCheckEvaluatesNoMessage) {
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  HP_CHECK(true) << touch();
  EXPECT_EQ(evaluated, 0);
}
