#include "hp/base/dist_env.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "hp/base/error.h"

namespace hp {
namespace {

struct Reader {
  const EnvGetter& get;

  bool has(const char* name) const {
    const char* v = get(name);
    return v && *v;
  }
  std::string str(const char* name) const {
    const char* v = get(name);
    HP_CHECK(v && *v) << "environment variable " << name << " is not set";
    return v;
  }
  long integer(const char* name) const {
    std::string s = str(name);
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    HP_CHECK(end && *end == '\0') << "environment variable " << name << "='" << s
                                  << "' is not an integer";
    return v;
  }
  long integer_or(const char* name, long fallback) const {
    return has(name) ? integer(name) : fallback;
  }
  // Slurm writes "4(x2),3" for tasks per node; the first count is ours when uniform.
  long leading_integer(const char* name) const { return std::strtol(str(name).c_str(), nullptr, 10); }
};

void read_rendezvous(const Reader& env, DistEnv& e, bool single_node) {
  if (env.has("MASTER_ADDR")) {
    e.master_addr = env.str("MASTER_ADDR");
  } else {
    HP_CHECK(single_node) << "MASTER_ADDR is not set and the job spans several nodes ("
                          << e.world_size << " ranks, " << e.local_world_size
                          << " per node): set MASTER_ADDR to the host of rank 0";
  }
  e.master_port = static_cast<int>(env.integer_or("MASTER_PORT", 29500));
}

}  // namespace

DistEnv read_dist_env(const EnvGetter& getenv) {
  Reader env{getenv};
  DistEnv e;
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    HP_CHECK(env.has("RANK") && env.has("WORLD_SIZE"))
        << (env.has("RANK") ? "RANK is set but WORLD_SIZE is not"
                            : "WORLD_SIZE is set but RANK is not");
    e.launcher = "hprun/torchrun";
    e.rank = env.integer("RANK");
    e.world_size = env.integer("WORLD_SIZE");
    e.local_rank = env.integer_or("LOCAL_RANK", e.rank);
    e.local_world_size = env.integer_or("LOCAL_WORLD_SIZE", e.world_size);
    HP_CHECK((env.has("MASTER_ADDR") && env.has("MASTER_PORT")) || e.world_size == 1)
        << "RANK and WORLD_SIZE are set but "
        << (env.has("MASTER_ADDR") ? "MASTER_PORT" : "MASTER_ADDR")
        << " is not: the launcher must give the rendezvous address";
    if (e.world_size > 1) read_rendezvous(env, e, true);
    const std::string agent = env.has("TORCHELASTIC_USE_AGENT_STORE") ? env.str("TORCHELASTIC_USE_AGENT_STORE") : "";
    e.launcher_store = agent == "True" || agent == "true" || agent == "1";
    e.restart_count = static_cast<int>(env.integer_or("HP_RESTART_COUNT", env.integer_or("TORCHELASTIC_RESTART_COUNT", 0)));
    e.node_rank = env.integer_or("GROUP_RANK", env.integer_or("NODE_RANK", e.rank / std::max(1, e.local_world_size)));
  } else if (env.has("OMPI_COMM_WORLD_RANK") || env.has("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = "mpirun";
    e.rank = env.integer("OMPI_COMM_WORLD_RANK");
    e.world_size = env.integer("OMPI_COMM_WORLD_SIZE");
    e.local_rank = env.integer_or("OMPI_COMM_WORLD_LOCAL_RANK", e.rank);
    e.local_world_size = env.integer_or("OMPI_COMM_WORLD_LOCAL_SIZE", e.world_size);
    e.node_rank = env.integer_or("OMPI_COMM_WORLD_NODE_RANK", e.rank / std::max(1, e.local_world_size));
    read_rendezvous(env, e, e.local_world_size == e.world_size);
  } else if (env.has("SLURM_PROCID")) {
    e.launcher = "slurm";
    e.rank = env.integer("SLURM_PROCID");
    e.world_size = env.integer("SLURM_NTASKS");
    e.local_rank = env.integer("SLURM_LOCALID");
    e.local_world_size = env.has("SLURM_NTASKS_PER_NODE") ? env.leading_integer("SLURM_NTASKS_PER_NODE")
                                                          : env.leading_integer("SLURM_TASKS_PER_NODE");
    e.node_rank = env.integer_or("SLURM_NODEID", 0);
    read_rendezvous(env, e, env.integer_or("SLURM_NNODES", 1) == 1);
  }
  if (env.has("HP_TIMEOUT_S")) {
    char* end = nullptr;
    std::string s = env.str("HP_TIMEOUT_S");
    e.timeout_s = std::strtod(s.c_str(), &end);
    HP_CHECK(end && *end == '\0' && e.timeout_s > 0)
        << "HP_TIMEOUT_S='" << s << "' must be a positive number of seconds";
  }
  HP_CHECK(e.world_size >= 1) << "world size must be at least 1, found " << e.world_size
                              << " (from " << e.launcher << " variables)";
  HP_CHECK(e.rank >= 0 && e.rank < e.world_size)
      << "rank " << e.rank << " is outside [0, " << e.world_size << ") (from " << e.launcher
      << " variables)";
  HP_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size)
      << "local world size " << e.local_world_size << " must be in [1, " << e.world_size << "]";
  HP_CHECK(e.local_rank >= 0 && e.local_rank < e.local_world_size)
      << "local rank " << e.local_rank << " is outside [0, " << e.local_world_size << ")";
  HP_CHECK(e.world_size == 1 || (e.master_port > 0 && e.master_port < 65536))
      << "MASTER_PORT=" << e.master_port << " is not a TCP port";
  return e;
}

DistEnv read_dist_env() {
  return read_dist_env([](const char* n) -> const char* { return std::getenv(n); });
}

}  // namespace hp
