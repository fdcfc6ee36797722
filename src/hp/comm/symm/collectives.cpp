#include "hp/comm/symm/collectives.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <string>

#include "hp/comm/group.h"
#include "hp/comm/symm/fold.h"
#include "hp/comm/symm/peers.h"
#include "hp/comm/symm/symm.h"

namespace hp::symm {

bool shm_collectives_enabled(const comm::Group& g) {
  const char* v = std::getenv("HP_SHM_COLLECTIVES");  // read each time: tests and benchmarks flip it
  const bool enabled = !(v && std::string(v) == "0");
  return enabled && g.device() == "cpu" && g.size() >= 2 && g.size() <= kMaxRanks && g.on_one_host();
}

bool can_reduce(at::ScalarType dtype) { return can_fold(dtype); }

at::Tensor try_in_place_buffer(int64_t numel, at::ScalarType dtype, const comm::Group& g) {
  if (!shm_collectives_enabled(g) || !can_reduce(dtype)) return at::Tensor();
  return try_empty({numel}, dtype, g);
}

at::Tensor try_output_buffer(int64_t numel, at::ScalarType dtype, const comm::Group& g) {
  if (numel * static_cast<int64_t>(c10::elementSize(dtype)) < static_cast<int64_t>(kInPlaceBytes)) return {};
  return try_local_empty(numel, dtype, g);
}

}  // namespace hp::symm
