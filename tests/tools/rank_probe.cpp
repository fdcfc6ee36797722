// A program for hprun's tests: joins the job, then behaves as told.
//   rank_probe ok               all ranks all-reduce their rank and print the sum
//   rank_probe crash R          rank R exits with code 3 after joining; the others wait forever
//   rank_probe absent R         rank R never joins; the others must time out naming it
//   rank_probe signal R         rank R kills itself with SIGKILL after joining
//   rank_probe shm_signal R     all ranks all-reduce over shared memory, then rank R creates a
//                               segment (as a rank dying mid-setup would leave) and kills itself
// Every mode prints the job's shared-memory prefix first ("shm prefix /hp-...").
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/segment.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  if (mode == "absent" && rank == target) return 0;
  try {
    std::cout << "shm prefix " << hp::symm::segment_prefix() << std::endl;
    auto world = hp::init_distributed();
    auto g = world->world_group();
    if (mode == "ok") {
      at::Tensor x = at::full({1}, double(world->rank()), at::kDouble);
      hp::comm::all_reduce_(x, *g);
      std::cout << "sum " << x.item<double>() << std::endl;
      return 0;
    }
    if (mode == "shm_signal") {
      at::Tensor x = at::ones({1000});
      hp::comm::all_reduce_(x, *g);
      std::cout << "shm sum " << x[0].item<double>() << std::endl;
      if (rank == target) {
        auto left = hp::symm::Segment::create(4096, "probe");
        std::cout << "left " << left.name() << std::endl;
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
