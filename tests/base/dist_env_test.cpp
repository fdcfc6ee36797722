#include <gtest/gtest.h>

#include <map>
#include <string>

#include "hp/base/dist_env.h"
#include "hp/base/error.h"

namespace {

hp::DistEnv read(const std::map<std::string, std::string>& vars) {
  return hp::read_dist_env([&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    read(vars);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DistEnv, NoLauncherIsOneProcess) {
  auto e = read({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.timeout_s, 300);
}

TEST(DistEnv, Torchrun) {
  auto e = read({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}, {"HP_TIMEOUT_S", "12.5"}});
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_DOUBLE_EQ(e.timeout_s, 12.5);
}

TEST(DistEnv, ALaunchersStoreAndTheAttempt) {
  const std::map<std::string, std::string> base{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                                {"MASTER_PORT", "1234"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(base.begin(), base.end());
    return read(extra);
  };
  EXPECT_FALSE(with({}).launcher_store);  // rank 0 hosts the store
  EXPECT_EQ(with({}).restart_count, 0);
  EXPECT_TRUE(with({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}).launcher_store);  // hprun's and torchrun's spelling
  EXPECT_FALSE(with({{"TORCHELASTIC_USE_AGENT_STORE", "False"}}).launcher_store);
  EXPECT_EQ(with({{"TORCHELASTIC_RESTART_COUNT", "3"}}).restart_count, 3);
  EXPECT_EQ(with({{"HP_RESTART_COUNT", "2"}, {"TORCHELASTIC_RESTART_COUNT", "3"}}).restart_count, 2);
}

TEST(DistEnv, NodeRankFromGroupRankThenNodeRank) {
  const std::map<std::string, std::string> base{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "2"},
                                                {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"},
                                                {"MASTER_PORT", "1234"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(base.begin(), base.end());
    return read(extra).node_rank;
  };
  EXPECT_EQ(with({}), 2);  // rank / LOCAL_WORLD_SIZE
  EXPECT_EQ(with({{"NODE_RANK", "3"}}), 3);
  EXPECT_EQ(with({{"NODE_RANK", "3"}, {"GROUP_RANK", "1"}}), 1);  // torchrun's and hprun's name first
}

TEST(DistEnv, Mpirun) {
  auto e = read({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // one node: loopback
  EXPECT_EQ(e.master_port, 29500);
}

TEST(DistEnv, Slurm) {
  auto e = read({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "3"},
                 {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "2"},
                 {"MASTER_ADDR", "node0"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node0");
}

TEST(DistEnv, ErrorsNameTheVariables) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("rank 4 is outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"},
                      {"SLURM_TASKS_PER_NODE", "4"}, {"SLURM_NNODES", "2"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"HP_TIMEOUT_S", "-1"}}).find("HP_TIMEOUT_S"), std::string::npos);
}
