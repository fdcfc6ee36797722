// The vision_llm example end to end: 3 processes through hprun, the encoder on one rank
// and the tensor-parallel decoder on two; it must train (its exit code says whether the
// loss fell) and print its losses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

TEST(VisionLlmExample, TrainsOnThreeRanksAndTheLossFalls) {
  std::string cmd = "HP_TIMEOUT_S=60 " HP_BIN_DIR "/hprun --nproc-per-node 3 " HP_BIN_DIR "/vision_llm 12 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("step 0 loss"), std::string::npos) << out;
  EXPECT_NE(out.find(" -> "), std::string::npos) << out;
}
