// Two ranks as threads: a row-sharded weight times a replicated input, gathered whole and
// checked against the product on one device.
#include <iostream>

#include "hp/hp.h"

int main() {
  bool ok = true;
  hp::comm::run_local_ranks(2, [&](int rank) {
    auto mesh = hp::init_device_mesh("cpu", {2}, {"tp"});
    hp::manual_seed(0);
    at::Tensor w = hp::randn({6, 4}), x = hp::randn({3, 4});
    auto y = hp::linear(hp::distribute_tensor(x, mesh, {hp::Replicate()}),
                        hp::distribute_tensor(w, mesh, {hp::Shard(0)}));  // [3, 6] as S(1)
    if (!at::allclose(y.full_tensor(), at::linear(x, w))) ok = false;
  });
  std::cout << (ok ? "consumer: ok" : "consumer: WRONG") << std::endl;
  return ok ? 0 : 1;
}
