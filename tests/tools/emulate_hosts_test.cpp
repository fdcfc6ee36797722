// scripts/emulate_hosts end to end: two emulated hosts (network namespaces) of two ranks
// each, joined by hprun across hosts (collectives, a job-wide abort, restarts together);
// and the script's own contract. Needs root (CI runs
// as root); skipped where network namespaces cannot be made.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "shell.h"

namespace {

// With `timeout_s`, a run still going then is stopped (exit code 124): a hang fails the test.
Result run(const std::string& args, int timeout_s = 0) {
  const std::string limit = timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "";
  return shell(limit + PROJECT_DIR "/scripts/emulate_hosts " + args);
}

std::string namespaces() { return shell("ip netns list").output; }

// Two hosts of two ranks under one hprun each, joined through node 0's hprun.
Result run_two_nodes(const std::string& hprun_flags, const std::string& program, int timeout_s = 0) {
  return run("--hosts 2 -- " HP_BIN_DIR "/hprun " + hprun_flags +
                 " --nnodes 2 --node-rank {node_rank} --master-addr {master_addr} --master-port {master_port} "
                 "--nproc-per-node 2 " + program,
             timeout_s);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(HierEmulatedHosts, TwoHostsOfTwoRanksRunHierarchicalAndMatchFlat) {
  Result r = run("--hosts 2 -- " HP_BIN_DIR "/hprun --nnodes 2 --node-rank {node_rank} --master-addr {master_addr} "
                 "--master-port {master_port} --nproc-per-node 2 " HIER_PROBE);
  if (r.code == 77) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 4; ++k) {
    // 3 dtypes x 2 sizes x 3 collectives, Gloo on the host's own address, not loopback.
    const std::string host = k < 2 ? "10.77.0.1, host 0" : "10.77.0.2, host 1";
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: hier ok: 18 hierarchical calls, gloo on " + host),
              std::string::npos)
        << r.output;
  }
}

// Hosts have their own cores: two emulated hosts split the cores the script may use, and
// hprun gives each host's rank that share as threads, not every core of the machine.
TEST(HierEmulatedHosts, EachHostRunsOnItsOwnShareOfTheCores) {
  cpu_set_t usable;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(usable), &usable), 0);
  const int share = std::max(1, CPU_COUNT(&usable) / 2);
  // Unset, as ctest sets it: hprun sets only what is unset.
  Result r = shell("OMP_NUM_THREADS= " PROJECT_DIR "/scripts/emulate_hosts --hosts 2 -- " HP_BIN_DIR
                   "/hprun --nnodes 2 --node-rank {node_rank} --master-addr {master_addr} --master-port {master_port} "
                   "--nproc-per-node 1 sh -c 'echo threads=$OMP_NUM_THREADS cores=$(taskset -pc $$ | sed \"s/.*: //\")'");
  if (r.code == 77) GTEST_SKIP() << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  std::string cores[2];
  for (int k = 0; k < 2; ++k) {
    const std::string tag = "[rank" + std::to_string(k) + "]: threads=" + std::to_string(share) + " cores=";
    const size_t at = r.output.find(tag);
    ASSERT_NE(at, std::string::npos) << tag << " in\n" << r.output;
    cores[k] = r.output.substr(at + tag.size(), r.output.find('\n', at) - at - tag.size());
  }
  if (CPU_COUNT(&usable) >= 2) EXPECT_NE(cores[0], cores[1]) << r.output;
}

TEST(HprunAcrossHosts, ARankFailingOnOneNodeStopsTheRanksOfEveryNode) {
  // Rank 3 (node 1) exits with code 3; ranks 0-2 wait forever unless stopped. Node 0's hprun
  // names the failure itself: it heard of it through the job's store, not from the script.
  Result r = run_two_nodes("", RANK_PROBE " crash 3", /*timeout_s=*/300);
  if (r.code == 77) GTEST_SKIP() << r.output;
  ASSERT_NE(r.code, 124) << "the other ranks were not stopped\n" << r.output;
  EXPECT_EQ(r.code, 3) << r.output;
  const std::string failure = "exited with code 3; stopped the other ranks on every node";
  EXPECT_EQ(count(r.output, failure), 2u) << r.output;  // once per node
  EXPECT_NE(r.output.find("rank 3 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(") on node 1 " + failure), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("interrupted"), std::string::npos) << r.output;
}

TEST(HprunAcrossHosts, MaxRestartsRestartsEveryNodeTogether) {
  // Rank 3 fails in the first attempt only; the second rendezvouses all four ranks again.
  Result r = run_two_nodes("--max-restarts 1", RANK_PROBE " crash_once 3");
  if (r.code == 77) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "restarting the group (restart 1 of 1, every node)"), 2u) << r.output;
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("[rank" + std::to_string(k) + "]: sum 6"), std::string::npos) << r.output;
}

TEST(HierEmulatedHosts, ScriptReturnsTheFirstFailureAndRemovesItsNamespaces) {
  // Node 1 fails at once; node 0 would sleep for a minute unless stopped.
  Result r = run("--hosts 2 --rate 1gbit -- bash -c "
                 "'ip netns identify; if [ $NODE_RANK = 1 ]; then exit 4; fi; exec sleep 60'");
  if (r.code == 77) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("node 1 exited with code 4"), std::string::npos) << r.output;
  const size_t at = r.output.find("hp");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string ns = r.output.substr(at, r.output.find('\n', at) - at);  // hp<tag>-<i>
  EXPECT_EQ(namespaces().find(ns.substr(0, ns.size() - 2)), std::string::npos) << ns << " left:\n" << namespaces();
}

TEST(HierEmulatedHosts, ANamespaceThatCannotBeEnteredSkipsWithTheReason) {
  // As in a chroot: `ip netns exec` fails; every other `ip` call goes to the real one.
  Result real_ip = shell("command -v ip");
  if (real_ip.code != 0) GTEST_SKIP() << "no ip command";
  const std::string dir = ::testing::TempDir() + "fake_ip_" + std::to_string(::getpid());
  const std::string script = "#!/bin/sh\n"
                             "if [ \"$1 $2\" = \"netns exec\" ]; then\n"
                             "  echo 'mount --make-rslave / failed: Invalid argument' >&2; exit 1\n"
                             "fi\n"
                             "exec " + real_ip.output.substr(0, real_ip.output.find('\n')) + " \"$@\"\n";
  ASSERT_EQ(shell("mkdir -p " + dir).code, 0);
  FILE* f = std::fopen((dir + "/ip").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(script.c_str(), f);
  std::fclose(f);
  ASSERT_EQ(shell("chmod +x " + dir + "/ip").code, 0);
  Result r = shell("PATH=" + dir + ":$PATH " PROJECT_DIR "/scripts/emulate_hosts --hosts 2 -- echo ran");
  shell("rm -rf " + dir);
  if (r.code == 77 && r.output.find("needs root") != std::string::npos) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.code, 77) << r.output;
  EXPECT_NE(r.output.find("cannot create and enter a network namespace here"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mount --make-rslave / failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ran"), std::string::npos) << r.output;
  EXPECT_EQ(namespaces().find("hpq"), std::string::npos) << namespaces();  // the probe's is gone
}
