// A program for hprun's tests: joins the job, then behaves as told.
//   rank_probe ok               all ranks all-reduce their rank and print the sum
//   rank_probe crash R          rank R exits with code 3 after joining; the others wait forever
//   rank_probe absent R         rank R never joins; the others must time out naming it
//   rank_probe signal R         rank R kills itself with SIGKILL after joining
//   rank_probe shm_signal R     all ranks all-reduce over shared memory, then rank R creates a
//                               segment (as a rank dying mid-setup would leave) and kills itself
//   rank_probe shm_hold R       as shm_signal, but rank R prints its pid and waits to be killed
//   rank_probe crash_once R     in the first attempt as crash R; in later ones as ok
//   rank_probe listening        after an all-reduce, rank 0 prints `ss -ltnp` lines of every
//                               rank and the launcher ("listen ADDRESS:PORT")
// Every mode prints the job's shared-memory prefix first ("shm prefix /hp-...").
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/segment.h"

namespace {

// Every listening TCP socket of the job's processes on this host, as `ss` shows them.
int print_listening(hp::comm::World& world, hp::comm::Group& g) {
  at::Tensor pids = at::zeros({world.size()}, at::kLong);
  pids[world.rank()] = static_cast<int64_t>(::getpid());
  hp::comm::all_reduce_(pids, g);
  if (world.rank() == 0) {
    std::vector<std::string> owners;
    for (int r = 0; r < world.size(); ++r) owners.push_back("pid=" + std::to_string(pids[r].item<int64_t>()) + ",");
    if (const char* launcher = std::getenv("HP_LAUNCHER_PID")) owners.push_back("pid=" + std::string(launcher) + ",");
    FILE* p = ::popen("ss -ltnpH", "r");
    char line[1024];
    while (p && std::fgets(line, sizeof line, p)) {
      const std::string l = line;
      for (const auto& o : owners) {
        if (l.find(o) == std::string::npos) continue;
        std::istringstream fields(l);
        std::string state, recv_q, send_q, local;
        fields >> state >> recv_q >> send_q >> local;
        std::cout << "listen " << local << " (" << o.substr(0, o.size() - 1) << ")" << std::endl;
      }
    }
    if (p) ::pclose(p);
  }
  hp::comm::all_reduce_(pids, g);  // nobody leaves before rank 0 has looked
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  if (mode == "absent" && rank == target) return 0;
  try {
    std::cout << "shm prefix " << hp::symm::segment_prefix() << std::endl;
    const char* restart = std::getenv("HP_RESTART_COUNT");
    if (mode == "crash_once") mode = restart && std::atoi(restart) > 0 ? "ok" : "crash";
    auto world = hp::init_distributed();
    auto g = world->world_group();
    if (mode == "listening") return print_listening(*world, *g);
    if (mode == "ok") {
      at::Tensor x = at::full({1}, double(world->rank()), at::kDouble);
      hp::comm::all_reduce_(x, *g);
      std::cout << "sum " << x.item<double>() << std::endl;
      return 0;
    }
    if (mode == "shm_signal" || mode == "shm_hold") {
      at::Tensor x = at::ones({1000});
      hp::comm::all_reduce_(x, *g);
      std::cout << "shm sum " << x[0].item<double>() << std::endl;
      if (rank == target) {
        auto left = hp::symm::Segment::create(4096, "probe");
        std::cout << "left " << left.name() << std::endl;
        if (mode == "shm_hold") {
          std::cout << "pid " << ::getpid() << std::endl;
          for (;;) ::pause();
        }
        ::kill(::getpid(), SIGKILL);
      }
    }
    if (rank == target) {
      if (mode == "crash") return 3;
      if (mode == "signal") ::kill(::getpid(), SIGKILL);
    }
    for (;;) ::pause();  // only hprun can end us
  } catch (const hp::Error& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
