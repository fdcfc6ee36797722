// Ring attention. Each rank keeps its queries; the K/V blocks travel around the cp ring
// (send to rank + 1, receive from rank - 1, the next block in flight while this one is
// computed) and are attended blockwise (context_parallel_blocks.h).
//
// The backward is our own rather than autograd's through the forward: autograd would keep
// every tile's probabilities alive until backward (the whole S x S/cp score matrix per
// rank). Instead the forward keeps only its inputs, the output and the log-sum-exp; the
// backward sends the K/V blocks around the ring once more, recomputes each block's
// probabilities, and passes each block's dK/dV along with it, one hop more to return it
// to its owner.
#include <ATen/ATen.h>

#include "hp/comm/collectives.h"
#include "hp/parallel/context_parallel_blocks.h"

namespace hp::cp {
namespace {

constexpr int kForwardTag = 0x4350, kBackwardTag = 0x4351, kGradTag = 0x4352;

// One hop of a ring: sends `mine` to the next rank, receives the previous rank's into a
// tensor shaped as `shape`. Zero-length pieces (more ranks than tokens) are not sent.
struct Hop {
  comm::Pending sent, received;
  at::Tensor incoming;
  at::Tensor wait() {
    sent.wait();
    return incoming.numel() ? received.wait() : incoming;
  }
};
Hop start_hop(const comm::Group& g, const at::Tensor& mine, std::vector<int64_t> shape, int tag) {
  const int cp = g.size(), next = (g.rank() + 1) % cp, prev = (g.rank() + cp - 1) % cp;
  Hop hop;
  hop.incoming = at::empty(shape, mine.options());
  if (hop.incoming.numel()) hop.received = comm::recv_async(hop.incoming, g, prev, tag);
  hop.sent = mine.numel() ? comm::send_async(mine, g, next, tag) : comm::Pending::done(mine);
  return hop;
}

// The K/V block (k and v stacked, [2, B, Hkv, L, D]) of cp rank `owner`'s shape.
std::vector<int64_t> block_shape(const at::Tensor& kv, int64_t length) {
  auto s = kv.sizes().vec();
  s[3] = length;
  return s;
}

}  // namespace

at::Tensor ring_attention(const AttentionArgs& a) {
  const comm::Group& g = *a.group;
  const int cp = g.size(), rank = g.rank();
  BlockwiseState state = start_blockwise(a.q);
  {
    at::NoGradGuard no_grad;
    at::Tensor kv = stack_kv(a.k, a.v);
    for (int step = 0; step < cp; ++step) {
      const int owner = (rank - step + cp) % cp;
      Hop hop;
      if (step + 1 < cp) hop = start_hop(g, kv, block_shape(kv, a.lengths[(owner + cp - 1) % cp]), kForwardTag);
      attend_block(a, owner, kv, state);
      if (step + 1 < cp) kv = hop.wait();
    }
  }
  return attach_blockwise_backward(a, state, [](const at::Tensor& dout, const AttentionArgs& a,
                                                const BlockwiseState& state) -> std::vector<at::Tensor> {
    const comm::Group& g = *a.group;
    const int cp = g.size(), rank = g.rank();
    at::Tensor dq = at::zeros_like(a.q);
    at::Tensor kv = stack_kv(a.k, a.v);
    at::Tensor dkv = at::zeros_like(kv);  // the travelling block's dK, dV so far
    for (int step = 0; step < cp; ++step) {
      const int owner = (rank - step + cp) % cp, prev_owner = (owner + cp - 1) % cp;
      Hop hop;
      if (step + 1 < cp) hop = start_hop(g, kv, block_shape(kv, a.lengths[prev_owner]), kBackwardTag);
      dkv = dkv + attend_block_backward(a, owner, kv, dout, state, dq);
      // The block's gradient follows the block; after the last step it goes home.
      if (cp > 1) dkv = start_hop(g, dkv, block_shape(dkv, a.lengths[prev_owner]), kGradTag).wait();
      if (step + 1 < cp) kv = hop.wait();
    }
    return {dq, dkv[0], dkv[1]};
  }, "RingAttentionBackward");
}

}  // namespace hp::cp
