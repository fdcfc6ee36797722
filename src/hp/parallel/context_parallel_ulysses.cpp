// Ulysses: an all-to-all turns the sequence-sharded q, k, v into head-sharded ones over
// the whole sequence; attention runs locally; an all-to-all turns the result back.
#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm/autograd.h"
#include "hp/parallel/context_parallel_kernels.h"
#include "hp/tensor/meta_ops.h"

namespace hp::cp {

at::Tensor ulysses_attention(const AttentionArgs& a) {
  const comm::Group& g = *a.group;
  const int64_t cp = g.size(), hq = a.q.size(1), hkv = a.k.size(1);
  HP_CHECK(hq % cp == 0) << "ulysses context parallelism splits the " << hq << " query heads held on each rank "
                         << "(after tensor parallelism) over " << cp << " cp ranks, which does not divide them; "
                         << "choose a cp degree that divides the heads, or the ring or allgather_kv mode";
  // K/V heads go out as they are when cp divides them. Otherwise each is repeated the fewest
  // times that lets every rank receive the K/V heads of its own query heads (query head h
  // reads K/V head h / (hq / hkv), as at::scaled_dot_product_attention's enable_gqa).
  const int64_t repeat = kv_head_repeats(hq, hkv, cp);
  at::Tensor k = repeat > 1 ? a.k.repeat_interleave(repeat, 1) : a.k;
  at::Tensor v = repeat > 1 ? a.v.repeat_interleave(repeat, 1) : a.v;

  // Sequence pieces of every rank arrive in rank order (the layout's order); put back in the
  // natural order, the whole sequence takes the fused causal kernel, with no mask and no
  // score matrix in memory.
  const at::Tensor order = positions_of_all(a.runs).to(a.q.device());
  const at::Tensor natural = at::argsort(order);
  auto to_heads = [&](const at::Tensor& t) {
    return comm::autograd::all_to_all(t, g, 1, 2, {}, a.lengths).index_select(2, natural);
  };
  at::Tensor q_h = to_heads(a.q), k_h = to_heads(k), v_h = to_heads(v);
  at::Tensor out = attention(q_h, k_h, v_h, std::nullopt, a.causal, a.scale).index_select(2, order);
  return comm::autograd::all_to_all(out, g, 2, 1, a.lengths, {});
}

int64_t kv_head_repeats(int64_t q_heads, int64_t kv_heads, int64_t cp) {
  const int64_t group = q_heads / kv_heads;
  int64_t repeat = 1;
  while ((kv_heads * repeat) % cp != 0 || group % repeat != 0) ++repeat;  // ends at `group` when cp divides q_heads
  return repeat;
}

}  // namespace hp::cp
