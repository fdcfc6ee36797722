#include <gtest/gtest.h>

#include <string>

#include "hp/base/error.h"
#include "hp/train/corpus.h"
#include "hp/train/tokenizer.h"

TEST(Tokenizer, RoundTripsAnyBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  for (const std::string& s : {std::string(), std::string("hello, world\n"), all,
                               std::string("na\xc3\xafve \xe2\x9c\x93")}) {
    auto t = hp::train::encode(s);
    ASSERT_EQ(t.size(), s.size());
    for (auto v : t) {
      EXPECT_GE(v, 0);
      EXPECT_LT(v, hp::train::kByteVocab);
    }
    EXPECT_EQ(hp::train::decode(t), s);
  }
  EXPECT_EQ(hp::train::encode("A\xff"), (std::vector<int64_t>{65, 255}));
}

TEST(Tokenizer, DecodeRejectsNonBytes) {
  try {
    hp::train::decode({65, 256});
    FAIL() << "no throw";
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token[1] = 256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hp::train::decode({-1}), hp::Error);
}

TEST(Corpus, FortunesByDefault) {
  auto text = hp::train::read_text("");
  EXPECT_GT(text.size(), 50000u);  // fortunes + literature + riddles ~ 98 KB
  EXPECT_EQ(text.find("\n%\n"), std::string::npos);  // separators dropped
}

TEST(Corpus, MissingFileNamesIt) {
  try {
    hp::train::read_text("/nonexistent/corpus.txt");
    FAIL() << "no throw";
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.txt"), std::string::npos);
  }
}
