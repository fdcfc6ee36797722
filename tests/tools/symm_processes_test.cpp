// The shared-memory collectives with ranks as processes (hprun, one host): every
// collective over 1 MiB with private, in-heap and mixed buffers, with single-copy moves
// and without; calls that differ between ranks failing on every rank; and a rank killed
// inside a shared-memory barrier, named by every survivor as dead, not as late after the
// group's timeout (a minute here).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "shell.h"

namespace {

// `grace`: seconds hprun waits, once a rank has failed, before it kills the others.
Result probe(int ranks, const std::string& args, const std::string& env = "", int grace = 1) {
  return shell("HP_TIMEOUT_S=60 " + env + " " HP_BIN_DIR "/hprun --grace " + std::to_string(grace) +
               " --nproc-per-node " + std::to_string(ranks) + " " SYMM_PROBE " " + args);
}

bool has(const Result& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

// Whether sibling processes of one user may read each other's memory (the single-copy
// path): Yama's ptrace_scope, where the kernel has it, must be 0.
bool siblings_may_read_each_other() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  return !(scope >> value) || value == 0;
}

}  // namespace

TEST(SymmProcesses, EveryCollectiveOverAMebibyteWithPrivateHeapAndMixedBuffers) {
  for (const char* single : {"1", "0"}) {
    for (int ranks : {3, 4}) {
      Result r = probe(ranks, "collectives", std::string("HP_SHM_SINGLE_COPY=") + single);
      ASSERT_EQ(r.code, 0) << r.output;
      // The path asked for is the one taken (the probe falls back to the windows quietly).
      const bool on = std::string(single) == "1" && siblings_may_read_each_other();
      for (int k = 0; k < ranks; ++k) {
        const std::string ok = "[rank" + std::to_string(k) + "]: symm ok: ";
        const size_t at = r.output.find(ok);
        ASSERT_NE(at, std::string::npos) << r.output;
        const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
        EXPECT_NE(line.find(on ? "single copy on" : "single copy off"), std::string::npos)
            << line << ": HP_SHM_SINGLE_COPY=" << single << ", cross-process reads "
            << (siblings_may_read_each_other() ? "allowed" : "refused by Yama");
      }
    }
  }
}

TEST(SymmProcesses, CallsThatDifferFailOnEveryRank) {
  Result r = probe(3, "mismatch");
  ASSERT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    const std::string me = "[rank" + std::to_string(k) + "]: ";
    EXPECT_TRUE(has(r, me + "mismatch: reduce_scatter on group [0, 1, 2]")) << r.output;
    EXPECT_TRUE(has(r, me + "mismatch: broadcast on group [0, 1, 2]")) << r.output;
    EXPECT_TRUE(has(r, me + "in step")) << r.output;
    EXPECT_FALSE(has(r, me + "no error")) << r.output;
  }
  EXPECT_TRUE(has(r, "group ranks [0, 1] made call 0, reduce_scatter (sum, Float) of 1200004 bytes, elements per "
                     "rank [100001, 100001, 99999]; group rank 2 made call 0, reduce_scatter (sum, Float) of 1200004 "
                     "bytes, elements per rank [100017, 100001, 99983]"))
      << r.output;
  EXPECT_TRUE(has(r, "group ranks [0, 1] made call 0, broadcast of 4000 bytes from group rank 0; group rank 2 made "
                     "call 0, broadcast of 4000 bytes from group rank 1"))
      << r.output;
}

TEST(SymmProcesses, PeerKilledInsideABarrierIsNamedBySurvivors) {
  // Rank 1 dies waiting for rank 2: rank 0, waiting beside it, finds out in that barrier;
  // rank 2 comes late, passes it (both peers had arrived) and finds out in its next call
  // (or in the barrier, if rank 1 was too slow to reach it before its end).
  Result r = probe(3, "kill 1 2", "", /*grace=*/3);  // rank 2 wakes after 1 s
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "rank 1 (pid")) << r.output;
  EXPECT_TRUE(has(r, "signal 9")) << r.output;
  EXPECT_TRUE(has(r, "[rank0]: error: hp::symm::barrier on group [0, 1, 2]")) << r.output;
  for (int k : {0, 2}) {
    const size_t at = r.output.find("[rank" + std::to_string(k) + "]: error: ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(line.find("rank 1 (pid"), std::string::npos) << line;
    EXPECT_NE(line.find("has died"), std::string::npos) << line;
  }
  EXPECT_FALSE(has(r, "no error")) << r.output;
}
