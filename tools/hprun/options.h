// hprun's command line: like torchrun's, parsed without dependencies.
#pragma once

#include <string>
#include <vector>

namespace hp::run {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // default: 127.0.0.1 on one node
  int master_port = 0;      // 0: pick a free port (one node only)
  int max_restarts = 0;
  double grace_s = 5;       // SIGTERM -> SIGKILL delay when stopping ranks
  std::vector<std::string> command;
};

// Throws hp::Error naming the bad flag or value. With --nnodes above 1, NODE_RANK,
// MASTER_ADDR and MASTER_PORT from the environment stand in for missing flags.
Options parse_options(int argc, char** argv);
std::string usage();

}  // namespace hp::run
