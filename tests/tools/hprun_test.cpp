// hprun end to end: separate processes, real TCPStore rendezvous.
#include <gtest/gtest.h>

#include <dirent.h>

#include <cstdio>
#include <string>
#include <vector>

#include "shell.h"

namespace {

Result run(const std::string& args, const std::string& env = "") {
  return shell(env + " " HP_BIN_DIR "/hprun " + args);
}

const std::string probe = RANK_PROBE;

// The job's shared-memory prefix the probe printed, and what of it is left in /dev/shm.
std::vector<std::string> segments_left(const std::string& output) {
  const std::string key = "shm prefix /";
  auto at = output.find(key);
  EXPECT_NE(at, std::string::npos) << output;
  if (at == std::string::npos) return {};
  const std::string stem = output.substr(at + key.size(), output.find('\n', at) - at - key.size()) + "-";
  EXPECT_GT(stem.size(), 10u) << output;
  std::vector<std::string> left;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(stem, 0) == 0) left.push_back(e->d_name);
    ::closedir(d);
  }
  return left;
}

}  // namespace

TEST(Hprun, FourRanksRendezvousAndAllReduce) {
  Result r = run("--nproc-per-node 4 " + probe + " ok");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: sum 6"), std::string::npos) << r.output;
  EXPECT_TRUE(segments_left(r.output).empty()) << r.output;  // shared-memory collectives left nothing
}

TEST(Hprun, NoSharedMemoryLeftAfterSigkill) {
  // Rank 1 dies holding a named segment; the others wait until hprun stops them.
  Result r = run("--nproc-per-node 3 " + probe + " shm_signal 1");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank0]: shm sum 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank1]: left /hp-"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
  EXPECT_TRUE(segments_left(r.output).empty()) << r.output;
}

TEST(Hprun, CrashingRankStopsTheOthersAndIsNamed) {
  // The survivors wait forever: the run ends only because hprun stops them.
  Result r = run("--nproc-per-node 3 " + probe + " crash 2");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 2 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 3"), std::string::npos) << r.output;
}

TEST(Hprun, KilledRankIsNamedWithItsSignal) {
  Result r = run("--nproc-per-node 2 " + probe + " signal 1");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

TEST(Hprun, AbsentRankGivesATimeoutNamingIt) {
  Result r = run("--nproc-per-node 3 " + probe + " absent 1", "HP_TIMEOUT_S=2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("missing ranks [1]"), std::string::npos) << r.output;
}

TEST(Hprun, RestartsTheGroup) {
  // Rank 0 fails every time after a last word that must reach the output; rank 1 waits.
  Result r = run("--max-restarts 2 --nproc-per-node 2 bash -c "
                 "'if [ $RANK = 0 ]; then echo try $HP_RESTART_COUNT; exit 1; fi; sleep 30'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("[rank0]: try 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up after 2 restart(s)"), std::string::npos) << r.output;
}

TEST(Hprun, BadFlagsAreNamed) {
  Result r = run("--nproc-per-node zero true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--nproc-per-node expects an integer"), std::string::npos) << r.output;
  r = run("--nnodes 2 --nproc-per-node 1 true");
  EXPECT_NE(r.output.find("needs --master-addr and --master-port"), std::string::npos) << r.output;
  r = run("--nproc-per-node 1 /nonexistent/program");
  EXPECT_EQ(r.code, 127) << r.output;
  EXPECT_NE(r.output.find("cannot execute"), std::string::npos) << r.output;
}

TEST(Hprun, TrainsTheDemoModelEndToEnd) {
  // A short dp=2 x tp=2 run of `hp train` as 4 processes: the loss must fall.
  const std::string cfg = ::testing::TempDir() + "hp_train_e2e.toml";
  FILE* f = std::fopen(cfg.c_str(), "w");
  std::fputs("[mesh]\nshape = [2, 2]\nnames = [\"dp\", \"tp\"]\n"
             "[model]\ndim = 32\nlayers = 1\nheads = 2\nkv_heads = 2\nffn_dim = 64\nmax_seq = 16\n"
             "[train]\nsteps = 12\nbatch = 4\nseq = 16\nlr = 1e-2\nwarmup = 2\nlog_every = 4\n",
             f);
  std::fclose(f);
  Result r = run("--nproc-per-node 4 " HP_BIN_DIR "/hp train --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  size_t at = r.output.find("[rank0]: done: loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double first = 0, last = 0;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "[rank0]: done: loss %lf -> %lf", &first, &last), 2) << r.output;
  EXPECT_LT(last, first) << r.output;
}

TEST(Hprun, TrainRejectsAMeshThatDoesNotFitTheRanks) {
  Result r = run("--nproc-per-node 2 " HP_BIN_DIR "/hp train --config " PROJECT_DIR "/configs/demo.toml");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("needs 4 ranks but 2 were started"), std::string::npos) << r.output;
}
