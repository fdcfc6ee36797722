// Who am I in the job? Read from the environment of hprun/torchrun, mpirun or Slurm.
#pragma once

#include <functional>
#include <string>

namespace hp {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: single process, no rendezvous needed
  double timeout_s = 300;
  std::string launcher = "none";  // "hprun/torchrun", "mpirun", "slurm" or "none"
  // The launcher hosts the store at MASTER_ADDR:MASTER_PORT and every rank is a client
  // (hprun, torchrun's agent: TORCHELASTIC_USE_AGENT_STORE); otherwise rank 0 hosts it.
  bool launcher_store = false;
  int restart_count = 0;  // HP_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT
};

using EnvGetter = std::function<const char*(const char*)>;

// Throws hp::Error naming the missing or inconsistent variables.
DistEnv read_dist_env(const EnvGetter& getenv);
DistEnv read_dist_env();  // from the process environment

}  // namespace hp
