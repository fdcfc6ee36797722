// hprun end to end: separate processes, real TCPStore rendezvous.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Result {
  int code;
  std::string output;
};

Result run(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " " HP_BIN_DIR "/hprun " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string probe = RANK_PROBE;

}  // namespace

TEST(Hprun, FourRanksRendezvousAndAllReduce) {
  Result r = run("--nproc-per-node 4 " + probe + " ok");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: sum 6"), std::string::npos) << r.output;
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
  Result r = run("--max-restarts 2 --nproc-per-node 2 bash -c 'echo try $HP_RESTART_COUNT; exit 1'");
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
