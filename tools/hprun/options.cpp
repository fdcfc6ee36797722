#include "options.h"

#include <cstdlib>

#include "hp/base/error.h"

namespace hp::run {
namespace {

int to_int(const std::string& flag, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  HP_CHECK(!v.empty() && *end == '\0' && x >= lo && x <= hi)
      << flag << " expects an integer in [" << lo << ", " << hi << "], got '" << v << "'";
  return static_cast<int>(x);
}

}  // namespace

std::string usage() {
  return "usage: hprun --nproc-per-node N [--nnodes M --node-rank R --master-addr HOST "
         "--master-port P] [--max-restarts K] [--grace S] PROGRAM [ARGS...]";
}

Options parse_options(int argc, char** argv) {
  Options o;
  bool node_rank_given = false, addr_given = false, port_given = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) break;  // the program starts here
    if (a == "--") {
      ++i;
      break;
    }
    std::string flag = a, value;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else {
      HP_CHECK(i + 1 < argc) << flag << " needs a value\n" << usage();
      value = argv[++i];
    }
    for (char& c : flag)
      if (c == '_') c = '-';  // accept torchrun's --nproc_per_node spelling too
    if (flag == "--nproc-per-node") o.nproc_per_node = to_int(flag, value, 1, 4096);
    else if (flag == "--nnodes") o.nnodes = to_int(flag, value, 1, 1 << 20);
    else if (flag == "--node-rank") o.node_rank = to_int(flag, value, 0, 1 << 20), node_rank_given = true;
    else if (flag == "--master-addr") o.master_addr = value, addr_given = true;
    else if (flag == "--master-port") o.master_port = to_int(flag, value, 1, 65535), port_given = true;
    else if (flag == "--max-restarts") o.max_restarts = to_int(flag, value, 0, 1 << 20);
    else if (flag == "--grace") o.grace_s = to_int(flag, value, 0, 3600);
    else HP_FAIL() << "unknown flag " << flag << "\n" << usage();
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  HP_CHECK(!o.command.empty()) << "no program to run\n" << usage();
  if (o.nnodes > 1) {
    // Several nodes: what the flags leave out may come from the environment, as a cluster
    // scheduler (or scripts/emulate_hosts) sets it for each node.
    auto env = [](const char* k) -> std::string { const char* v = std::getenv(k); return v ? v : ""; };
    if (!node_rank_given && !env("NODE_RANK").empty()) o.node_rank = to_int("NODE_RANK", env("NODE_RANK"), 0, 1 << 20);
    if (!addr_given && !env("MASTER_ADDR").empty()) o.master_addr = env("MASTER_ADDR");
    if (!port_given && !env("MASTER_PORT").empty()) o.master_port = to_int("MASTER_PORT", env("MASTER_PORT"), 1, 65535);
  }
  HP_CHECK(o.node_rank < o.nnodes) << "--node-rank " << o.node_rank << " must be below --nnodes "
                                   << o.nnodes;
  if (o.nnodes > 1) {
    HP_CHECK(!o.master_addr.empty() && o.master_port != 0)
        << "--nnodes " << o.nnodes
        << " needs --master-addr and --master-port (the host and port of node 0)";
  } else if (o.master_addr.empty()) {
    o.master_addr = "127.0.0.1";
  }
  return o;
}

}  // namespace hp::run
