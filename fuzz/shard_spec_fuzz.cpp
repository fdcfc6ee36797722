// ShardSpec arithmetic: every rank's piece lies inside the tensor and the pieces of one
// replica set add up to the whole tensor.
#include <cstdlib>

#include "fuzz/fuzz_input.h"
#include "hp/base/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hp::fuzz::Input in(data, size);
  hp::MeshShape mesh = in.mesh();
  std::vector<int64_t> shape = in.shape();
  std::vector<hp::Placement> ps = in.placements(static_cast<int>(shape.size()), mesh.ndim());
  if (!hp::partial_ops_compatible(ps)) return 0;
  hp::ShardSpec s(shape, 1 + in.next(8), mesh, ps);
  int64_t replicas = 1, held = 0;
  for (int d = 0; d < mesh.ndim(); ++d)
    if (!ps[d].is_shard()) replicas *= mesh.dim_size(d);
  for (int r : mesh.ranks()) {
    auto off = s.global_offset_of_rank(r), ls = s.local_shape_of_rank(r);
    int64_t n = 1;
    for (size_t i = 0; i < ls.size(); ++i) {
      if (off[i] < 0 || ls[i] < 0 || off[i] + ls[i] > shape[i]) std::abort();
      n *= ls[i];
    }
    if (s.local_bytes_of_rank(r) > s.max_local_bytes()) std::abort();
    held += n;
  }
  if (held != s.numel() * replicas) std::abort();
  return 0;
}
