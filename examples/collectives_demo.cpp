// The 4-rank collective demo: a 2x2 mesh, a collective on each mesh dim, a
// reduce-scatter / all-gather round trip, and an all-gather of a tensor in the symmetric
// heap (peers read it in place). Run: build/bin/hprun --nproc-per-node 4 build/bin/collectives_demo
#include <ATen/ATen.h>

#include <iostream>
#include <sstream>

#include "hp/comm.h"

int main() {
  auto world = hp::init_distributed();
  auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const int rank = world->rank();
  auto coord = mesh.coordinate();

  // Sum of global ranks along each mesh dim.
  at::Tensor x = at::full({1}, double(rank), at::kDouble);
  at::Tensor over_tp = hp::comm::all_reduce(x, mesh.group("tp"));
  at::Tensor over_dp = hp::comm::all_reduce(x, mesh.group("dp"));

  // Each rank holds 3 rows of a 12-row tensor: gather, then reduce-scatter back.
  at::Tensor mine = at::arange(3 * rank, 3 * rank + 3, at::kFloat);
  at::Tensor all = hp::comm::all_gather(mine, mesh.whole_group());
  at::Tensor back = hp::comm::reduce_scatter(all, mesh.whole_group()) / world->size();

  // A tensor in the symmetric heap of a group on one host: from 256 KiB its collectives
  // read the peers' copies in place instead of staging them (allocate it on every rank).
  at::Tensor shared = hp::symm::empty({1 << 17}, at::kFloat, mesh.whole_group());
  shared.fill_(float(rank));
  at::Tensor gathered = hp::comm::all_gather(shared, mesh.whole_group());
  const bool shared_ok = at::equal(gathered.view({world->size(), -1}).select(1, 0),
                                   at::arange(world->size(), at::kFloat));

  std::ostringstream os;
  os << "rank " << rank << " at (dp=" << coord[0] << ", tp=" << coord[1] << ")"
     << ": sum over tp " << over_tp.item<double>() << ", over dp " << over_dp.item<double>()
     << "; gathered " << all.numel() << " values, round trip "
     << (at::equal(back, mine) ? "exact" : "WRONG") << "; symmetric all-gather "
     << (shared_ok ? "exact" : "WRONG");
  std::cout << os.str() << std::endl;
  return at::equal(back, mine) && shared_ok ? 0 : 1;
}
