// hybrid: Ulysses over the inner mesh dim (inside a host, where an all-to-all is cheap),
// then ring attention over the outer one (across hosts, point to point), then the
// all-to-all back. After the all-to-all, each rank of a ring group holds a share of the
// heads over the whole share of its ring rank: the runs of all its inner ranks.
#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm/autograd.h"
#include "hp/parallel/context_parallel_kernels.h"

namespace hp::cp {

at::Tensor hybrid_attention(const AttentionArgs& a, const comm::Group& inner) {
  const int64_t u = inner.size(), r = a.group->size(), j = a.group->rank();
  const int64_t hq = a.q.size(1), hkv = a.k.size(1);
  HP_CHECK(hq % u == 0) << "hybrid context parallelism splits the " << hq << " query heads held on each rank "
                        << "over the " << u << " ranks of its Ulysses mesh dim, which does not divide them";
  const int64_t repeat = kv_head_repeats(hq, hkv, u);
  at::Tensor k = repeat > 1 ? a.k.repeat_interleave(repeat, 1) : a.k;
  at::Tensor v = repeat > 1 ? a.v.repeat_interleave(repeat, 1) : a.v;

  const std::vector<int64_t> inner_lengths(a.lengths.begin() + j * u, a.lengths.begin() + (j + 1) * u);
  auto to_heads = [&](const at::Tensor& t) { return comm::autograd::all_to_all(t, inner, 1, 2, {}, inner_lengths); };
  AttentionArgs ring;
  ring.q = to_heads(a.q), ring.k = to_heads(k), ring.v = to_heads(v);
  ring.group = a.group;
  ring.causal = a.causal, ring.scale = a.scale;
  for (int64_t ring_rank = 0; ring_rank < r; ++ring_rank) {
    std::vector<SequenceRun> runs;
    int64_t length = 0;
    for (int64_t i = 0; i < u; ++i) {
      const auto& mine = a.runs[ring_rank * u + i];
      runs.insert(runs.end(), mine.begin(), mine.end());
      length += a.lengths[ring_rank * u + i];
    }
    ring.runs.push_back(runs);
    ring.lengths.push_back(length);
  }
  return comm::autograd::all_to_all(ring_attention(ring), inner, 2, 1, inner_lengths, {});
}

}  // namespace hp::cp
