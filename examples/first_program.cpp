// The README's first program: DTensors on a 2x2 mesh, a sharded linear layer, and a
// redistribution. Run: build/bin/hprun --nproc-per-node 4 build/bin/first_program
#include <iostream>

#include "hp/hp.h"

int main() {
  hp::init_distributed();
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  hp::manual_seed(0);
  auto w = hp::randn({1024, 512}, mesh, {hp::Replicate(), hp::Shard(0)});  // rows over tp
  auto x = hp::randn({8, 512}, mesh, {hp::Shard(0), hp::Replicate()});     // batch over dp
  auto y = hp::linear(x, w);            // [8, 1024] as [S(0), S(1)], no communication
  auto z = y.redistribute({hp::Shard(0), hp::Replicate()});
  if (mesh.rank() == 0) std::cout << y << "\n" << z << std::endl;
  return 0;
}
