#include "hp/parallel/context_parallel_blocks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <time.h>

#include <algorithm>
#include <limits>

namespace hp::cp {
namespace {

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

struct BlockwiseNode : torch::autograd::Node {
  AttentionArgs args;  // q, k, v detached
  BlockwiseState state;
  BlockwiseBackward backward;
  std::string label;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    return backward(grads[0].contiguous(), args, state);
  }
  std::string name() const override { return label; }
};

}  // namespace

RingAttentionStats& ring_attention_stats() {
  thread_local RingAttentionStats stats;
  return stats;
}

at::Tensor stack_kv(const at::Tensor& k, const at::Tensor& v) { return at::stack({k, v}); }

BlockwiseState start_blockwise(const at::Tensor& q) {
  return {at::zeros_like(q), at::full(q.sizes().slice(0, 3), -std::numeric_limits<double>::infinity(), q.options())};
}

void attend_block(const AttentionArgs& a, int owner, const at::Tensor& kv, BlockwiseState& state) {
  const int64_t group = a.q.size(1) / a.k.size(1);
  at::Tensor k = expand_heads(kv[0], group), v = expand_heads(kv[1], group);
  for_each_pair(a, owner, a.q, [&](const LocalRun& qr, const LocalRun& kr, const std::optional<at::Tensor>& mask) {
    at::Tensor s = scores(a.q.narrow(2, qr.row, qr.run.size), k.narrow(2, kr.row, kr.run.size), mask, a.scale);
    at::Tensor block_lse = s.logsumexp(-1);
    at::Tensor block_out = at::matmul((s - block_lse.unsqueeze(-1)).exp(), v.narrow(2, kr.row, kr.run.size));
    at::Tensor o = state.out.narrow(2, qr.row, qr.run.size), l = state.lse.narrow(2, qr.row, qr.run.size);
    at::Tensor merged = at::logaddexp(l, block_lse);  // finite: every attended pair gives a row a key
    o.copy_(o * (l - merged).exp().unsqueeze(-1) + block_out * (block_lse - merged).exp().unsqueeze(-1));
    l.copy_(merged);
  });
}

at::Tensor attend_block_backward(const AttentionArgs& a, int owner, const at::Tensor& kv, const at::Tensor& dout,
                                 const BlockwiseState& final_state, at::Tensor& dq) {
  const int64_t group = a.q.size(1) / a.k.size(1);
  const at::Tensor delta = (dout * final_state.out).sum(-1, /*keepdim=*/true);  // rowsum(dO * O)
  at::Tensor k = expand_heads(kv[0], group), v = expand_heads(kv[1], group);
  at::Tensor dk = at::zeros_like(k), dv = at::zeros_like(v);
  for_each_pair(a, owner, a.q, [&](const LocalRun& qr, const LocalRun& kr, const std::optional<at::Tensor>& mask) {
    at::Tensor q_rows = a.q.narrow(2, qr.row, qr.run.size), do_rows = dout.narrow(2, qr.row, qr.run.size);
    at::Tensor k_rows = k.narrow(2, kr.row, kr.run.size), v_rows = v.narrow(2, kr.row, kr.run.size);
    at::Tensor lse = final_state.lse.narrow(2, qr.row, qr.run.size).unsqueeze(-1);
    at::Tensor p = (scores(q_rows, k_rows, mask, a.scale) - lse).exp();
    dv.narrow(2, kr.row, kr.run.size).add_(at::matmul(p.transpose(-1, -2), do_rows));
    at::Tensor ds = p * (at::matmul(do_rows, v_rows.transpose(-1, -2)) - delta.narrow(2, qr.row, qr.run.size));
    dq.narrow(2, qr.row, qr.run.size).add_(at::matmul(ds, k_rows) * a.scale);
    dk.narrow(2, kr.row, kr.run.size).add_(at::matmul(ds.transpose(-1, -2), q_rows) * a.scale);
  });
  return at::stack({reduce_heads(dk, group), reduce_heads(dv, group)});
}

at::Tensor attach_blockwise_backward(const AttentionArgs& a, const BlockwiseState& final_state,
                                     BlockwiseBackward backward, const char* name) {
  const bool needs_grad = a.q.requires_grad() || a.k.requires_grad() || a.v.requires_grad();
  if (!needs_grad || !at::GradMode::is_enabled()) return final_state.out;
  auto node = std::shared_ptr<BlockwiseNode>(new BlockwiseNode(), torch::autograd::deleteNode);
  node->args = a;
  node->args.q = a.q.detach(), node->args.k = a.k.detach(), node->args.v = a.v.detach();
  node->state = {final_state.out.detach(), final_state.lse};  // not out itself: the node would keep itself alive
  node->backward = std::move(backward);
  node->label = name;
  node->set_next_edges(torch::autograd::collect_next_edges(a.q, a.k, a.v));
  at::Tensor out = final_state.out;
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace hp::cp
