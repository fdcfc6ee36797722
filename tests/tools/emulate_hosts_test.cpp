// scripts/emulate_hosts end to end: two emulated hosts (network namespaces) of two ranks
// each, joined by hprun across hosts; and the script's own contract. Needs root (CI runs
// as root); skipped where network namespaces cannot be made.
#include <gtest/gtest.h>

#include <string>

#include "shell.h"

namespace {

Result run(const std::string& args) { return shell(PROJECT_DIR "/scripts/emulate_hosts " + args); }

std::string namespaces() { return shell("ip netns list").output; }

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
