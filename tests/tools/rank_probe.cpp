// A program for hprun's tests: joins the job, then behaves as told.
//   rank_probe ok               all ranks all-reduce their rank and print the sum
//   rank_probe crash R          rank R exits with code 3 after joining; the others wait forever
//   rank_probe absent R         rank R never joins; the others must time out naming it
//   rank_probe signal R         rank R kills itself with SIGKILL after joining
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "hp/base/error.h"
#include "hp/comm.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  if (mode == "absent" && rank == target) return 0;
  try {
    auto world = hp::init_distributed();
    auto g = world->world_group();
    if (mode == "ok") {
      at::Tensor x = at::full({1}, double(world->rank()), at::kDouble);
      hp::comm::all_reduce_(x, *g);
      std::cout << "sum " << x.item<double>() << std::endl;
      return 0;
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
