// `hp dryrun --real` from the command line: a run prints memory beside the estimator and
// the collectives; bad input fails with a message that says what was expected.
#include <gtest/gtest.h>

#include <string>

#include "shell.h"

namespace {

Result hp(const std::string& args) { return shell(HP_BIN_DIR "/hp dryrun --real " + args); }

}  // namespace

TEST(DryrunReal, TinyModelPrintsMemoryAndCollectives) {
  Result r = hp("--model tiny --strategy dp=4,tp=2,fsdp=1 --devices 8 --rank 7");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 7 of 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("high-water mark"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("estimator (fp32-eager)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reduce_scatter"), std::string::npos) << r.output;

  // Pipeline stages: the last rank of pp = 2 x dp = 2 x tp = 2, interleaved.
  Result pp = hp("--model tiny --strategy pp=2,dp=2,tp=2,mb=4,schedule=interleaved-1f1b,vpp=2 --devices 8 --rank 7");
  ASSERT_EQ(pp.code, 0) << pp.output;
  EXPECT_NE(pp.output.find("rank 7 of 8"), std::string::npos) << pp.output;
  EXPECT_NE(pp.output.find("high-water mark"), std::string::npos) << pp.output;

  Result j = hp("--model tiny --strategy dp=8 --devices 8 --json");
  ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("\"high_water_MiB\""), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("\"all_reduce\""), std::string::npos) << j.output;
}

// A MoE model with expert parallelism: the token all-to-alls of one step (4 per MoE layer,
// plus one counts exchange each) equal the estimator's bytes.
TEST(DryrunReal, MoEModelWithExpertParallelism) {
  Result r = hp("--model " PROJECT_DIR "/configs/moe_desc.toml --strategy dp=2,ep=2,gbs=8 --devices 4 --rank 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ep=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  all_to_all                2       15            1.5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  estimator all_to_all                      1.5"), std::string::npos) << r.output;
}

TEST(DryrunReal, BadInputFailsClearly) {
  Result cp = hp("--model tiny --strategy dp=2,cp=2 --devices 4");
  EXPECT_EQ(cp.code, 1);
  EXPECT_NE(cp.output.find("the trainer runs dp, ep, tp, pp and fsdp; found cp=2"), std::string::npos) << cp.output;

  Result rank = hp("--model tiny --strategy dp=4 --devices 4 --rank 4");
  EXPECT_EQ(rank.code, 1);
  EXPECT_NE(rank.output.find("rank 4 is outside the mesh [4] of 4 ranks"), std::string::npos) << rank.output;

  Result odd = hp("--model tiny --strategy tp=3 --devices 8");
  EXPECT_EQ(odd.code, 1);
  EXPECT_NE(odd.output.find("hp: error:"), std::string::npos) << odd.output;
}
