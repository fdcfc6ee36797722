// Ring attention. Each rank keeps its queries; the K/V blocks travel around the cp ring
// (send to rank + 1, receive from rank - 1, the next block in flight while this one is
// computed), and each block's partial result is merged into the running one by the
// log-sum-exp rule. Work is planned per pair of tiles of positions (a query tile, a key
// tile): a key tile wholly before the query tile is attended in full, one wholly after is
// skipped, the overlapping one (a tile with itself) is masked. With the head-tail layout every rank
// then does the same work under a causal mask.
//
// The backward is our own rather than autograd's through the forward: autograd would keep
// every block's probabilities alive until backward (the whole S x S/cp score matrix per
// rank). Instead the forward keeps only its inputs, the output and the log-sum-exp; the
// backward sends the K/V blocks around the ring once more, recomputes each block's
// probabilities, and passes each block's dK/dV along with it, one hop more to return it
// to its owner.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <time.h>

#include <algorithm>
#include <limits>

#include "hp/comm/collectives.h"
#include "hp/parallel/context_parallel_kernels.h"

namespace hp::cp {
namespace {

constexpr int kForwardTag = 0x4350, kBackwardTag = 0x4351, kGradTag = 0x4352;

enum class Pair { full, masked, skipped };

Pair classify(const SequenceRun& q, const SequenceRun& k, bool causal) {
  if (!causal || k.first + k.size - 1 <= q.first) return Pair::full;
  if (k.first > q.first + q.size - 1) return Pair::skipped;
  return Pair::masked;
}

at::Tensor pair_mask(const SequenceRun& q, const SequenceRun& k, const at::Tensor& like) {
  auto opts = like.options().dtype(at::kLong);
  return at::arange(k.first, k.first + k.size, opts).unsqueeze(0) <=
         at::arange(q.first, q.first + q.size, opts).unsqueeze(1);
}

// Query heads h read K/V head h / group (at::scaled_dot_product_attention's enable_gqa).
at::Tensor expand_heads(const at::Tensor& kv, int64_t group) {
  return group == 1 ? kv : kv.repeat_interleave(group, 1);
}
at::Tensor reduce_heads(const at::Tensor& g, int64_t group) {
  if (group == 1) return g;
  auto s = g.sizes().vec();
  return g.view({s[0], s[1] / group, group, s[2], s[3]}).sum(2);
}

// The scores of a pair, masked where a key comes after a query.
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& mask, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (mask) s.masked_fill_(mask->logical_not(), -std::numeric_limits<double>::infinity());
  return s;
}

// Pieces of the runs of one rank, at most kTile positions each, with their row offsets in
// its local tensors. Tiles bound what a pair computes at once (kTile x kTile scores per
// head, made and freed in turn), so the transient memory does not grow with the sequence.
constexpr int64_t kTile = 256;
struct LocalRun {
  SequenceRun run;
  int64_t row;
};
std::vector<LocalRun> local_runs(const std::vector<SequenceRun>& runs) {
  std::vector<LocalRun> out;
  int64_t row = 0;
  for (const SequenceRun& r : runs)
    for (int64_t at = 0; at < r.size; at += kTile) {
      const int64_t size = std::min(kTile, r.size - at);
      out.push_back({{r.first + at, size}, row});
      row += size;
    }
  return out;
}

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Calls fn(query run, key run, mask or none) for every pair that attends at all.
template <typename Fn>
void for_each_pair(const AttentionArgs& a, int owner, const at::Tensor& like, Fn fn) {
  RingAttentionStats& stats = ring_attention_stats();
  const double start = thread_seconds();
  for (const LocalRun& qr : local_runs(a.runs[a.group->rank()]))
    for (const LocalRun& kr : local_runs(a.runs[owner])) {
      const Pair pair = classify(qr.run, kr.run, a.causal);
      if (pair == Pair::skipped) continue;
      std::optional<at::Tensor> mask;
      if (pair == Pair::masked) mask = pair_mask(qr.run, kr.run, like);
      fn(qr, kr, mask);
      stats.score_elements += qr.run.size * kr.run.size;
    }
  stats.compute_seconds += thread_seconds() - start;
}

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

struct RingOutput {
  at::Tensor out, lse;  // [B, Hq, L, D], [B, Hq, L]
};

RingOutput ring_forward(const AttentionArgs& a) {
  const comm::Group& g = *a.group;
  const int cp = g.size(), rank = g.rank();
  const int64_t group = a.q.size(1) / a.k.size(1);
  at::Tensor out = at::zeros_like(a.q);
  at::Tensor lse = at::full(out.sizes().slice(0, 3), -std::numeric_limits<double>::infinity(), a.q.options());
  at::Tensor kv = at::stack({a.k, a.v});
  for (int step = 0; step < cp; ++step) {
    const int owner = (rank - step + cp) % cp;
    Hop hop;
    if (step + 1 < cp) hop = start_hop(g, kv, block_shape(kv, a.lengths[(owner + cp - 1) % cp]), kForwardTag);
    at::Tensor k = expand_heads(kv[0], group), v = expand_heads(kv[1], group);
    for_each_pair(a, owner, a.q, [&](const LocalRun& qr, const LocalRun& kr, const std::optional<at::Tensor>& mask) {
      at::Tensor s = scores(a.q.narrow(2, qr.row, qr.run.size), k.narrow(2, kr.row, kr.run.size), mask, a.scale);
      at::Tensor block_lse = s.logsumexp(-1);
      at::Tensor block_out = at::matmul((s - block_lse.unsqueeze(-1)).exp(), v.narrow(2, kr.row, kr.run.size));
      at::Tensor o = out.narrow(2, qr.row, qr.run.size), l = lse.narrow(2, qr.row, qr.run.size);
      at::Tensor merged = at::logaddexp(l, block_lse);  // finite: every attended pair gives a row a key
      o.copy_(o * (l - merged).exp().unsqueeze(-1) + block_out * (block_lse - merged).exp().unsqueeze(-1));
      l.copy_(merged);
    });
    if (step + 1 < cp) kv = hop.wait();
  }
  return {out, lse};
}

struct RingAttentionBackward : torch::autograd::Node {
  AttentionArgs args;  // q, k, v detached
  at::Tensor out, lse;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const AttentionArgs& a = args;
    const comm::Group& g = *a.group;
    const int cp = g.size(), rank = g.rank();
    const int64_t group = a.q.size(1) / a.k.size(1);
    const at::Tensor dout = grads[0].contiguous();
    const at::Tensor delta = (dout * out).sum(-1, /*keepdim=*/true);  // rowsum(dO * O)
    at::Tensor dq = at::zeros_like(a.q);
    at::Tensor kv = at::stack({a.k, a.v});
    at::Tensor dkv = at::zeros_like(kv);  // the travelling block's dK, dV so far
    for (int step = 0; step < cp; ++step) {
      const int owner = (rank - step + cp) % cp, prev_owner = (owner + cp - 1) % cp;
      Hop hop;
      if (step + 1 < cp) hop = start_hop(g, kv, block_shape(kv, a.lengths[prev_owner]), kBackwardTag);
      at::Tensor k = expand_heads(kv[0], group), v = expand_heads(kv[1], group);
      at::Tensor dk = at::zeros_like(k), dv = at::zeros_like(v);
      for_each_pair(a, owner, a.q, [&](const LocalRun& qr, const LocalRun& kr, const std::optional<at::Tensor>& mask) {
        at::Tensor q_rows = a.q.narrow(2, qr.row, qr.run.size), do_rows = dout.narrow(2, qr.row, qr.run.size);
        at::Tensor k_rows = k.narrow(2, kr.row, kr.run.size), v_rows = v.narrow(2, kr.row, kr.run.size);
        at::Tensor p = (scores(q_rows, k_rows, mask, a.scale) - lse.narrow(2, qr.row, qr.run.size).unsqueeze(-1)).exp();
        dv.narrow(2, kr.row, kr.run.size).add_(at::matmul(p.transpose(-1, -2), do_rows));
        at::Tensor ds = p * (at::matmul(do_rows, v_rows.transpose(-1, -2)) - delta.narrow(2, qr.row, qr.run.size));
        dq.narrow(2, qr.row, qr.run.size).add_(at::matmul(ds, k_rows) * a.scale);
        dk.narrow(2, kr.row, kr.run.size).add_(at::matmul(ds.transpose(-1, -2), q_rows) * a.scale);
      });
      dkv = dkv + at::stack({reduce_heads(dk, group), reduce_heads(dv, group)});
      // The block's gradient follows the block; after the last step it goes home.
      if (cp > 1) dkv = start_hop(g, dkv, block_shape(dkv, a.lengths[prev_owner]), kGradTag).wait();
      if (step + 1 < cp) kv = hop.wait();
    }
    return {dq, dkv[0], dkv[1]};
  }
  std::string name() const override { return "RingAttentionBackward"; }
};

}  // namespace

RingAttentionStats& ring_attention_stats() {
  thread_local RingAttentionStats stats;
  return stats;
}

at::Tensor ring_attention(const AttentionArgs& a) {
  RingOutput r;
  {
    at::NoGradGuard no_grad;
    r = ring_forward(a);
  }
  const bool needs_grad = a.q.requires_grad() || a.k.requires_grad() || a.v.requires_grad();
  if (!needs_grad || !at::GradMode::is_enabled()) return r.out;
  auto node = std::shared_ptr<RingAttentionBackward>(new RingAttentionBackward(), torch::autograd::deleteNode);
  node->args = a;
  node->args.q = a.q.detach(), node->args.k = a.k.detach(), node->args.v = a.v.detach();
  node->out = r.out.detach();  // not r.out itself: the node would keep itself alive
  node->lse = r.lse;
  node->set_next_edges(torch::autograd::collect_next_edges(a.q, a.k, a.v));
  torch::autograd::set_history(r.out, node);
  return r.out;
}

}  // namespace hp::cp
