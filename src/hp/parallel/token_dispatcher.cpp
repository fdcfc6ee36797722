#include "hp/parallel/token_dispatcher.h"

#include <ATen/ATen.h>

#include <chrono>

#include "hp/base/error.h"
#include "hp/comm/autograd.h"
#include "hp/comm/collectives.h"
#include "hp/layout/shard_spec.h"
#include "hp/parallel/token_dispatcher_chunks.h"
#include "hp/tensor/op_observer.h"

namespace hp {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rows of `t` out in `send` pieces, in `recv` pieces back; the backward is the inverse
// exchange. Both directions add their wall time to `seconds`. The forward's exchange is an
// observed collective: a selective checkpoint keeps its output instead of exchanging again.
at::Tensor exchange_rows(const at::Tensor& t, const comm::Group& g, const std::vector<int64_t>& send,
                         const std::vector<int64_t>& recv, const std::shared_ptr<double>& seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor out =
      observe_collective("token all_to_all", t, [&] { return comm::all_to_all(t.detach(), g, 0, 0, send, recv); });
  *seconds += since(t0);
  return comm::autograd::attach_backward(out, t, [&g, send, recv, seconds](const at::Tensor& grad) {
    const auto t1 = std::chrono::steady_clock::now();
    at::Tensor back = comm::all_to_all(grad, g, 0, 0, recv, send);
    *seconds += since(t1);
    return back;
  }, "TokenAllToAllBackward");
}

}  // namespace

at::Tensor expert_major_order(const int64_t* arrived, int sources, int64_t experts, std::vector<int64_t>* per_expert) {
  // Arrived grouped by source then expert; the experts want them by expert then source.
  const int64_t* a = arrived;
  std::vector<int64_t> source_start(sources, 0), order;
  for (int s = 1; s < sources; ++s) {
    source_start[s] = source_start[s - 1];
    for (int64_t e = 0; e < experts; ++e) source_start[s] += a[(s - 1) * experts + e];
  }
  per_expert->assign(experts, 0);
  for (int64_t e = 0; e < experts; ++e)
    for (int s = 0; s < sources; ++s) {
      int64_t start = source_start[s];
      for (int64_t f = 0; f < e; ++f) start += a[s * experts + f];
      for (int64_t i = 0; i < a[s * experts + e]; ++i) order.push_back(start + i);
      (*per_expert)[e] += a[s * experts + e];
    }
  return at::tensor(order, at::kLong);
}

nn::DispatchedTokens AllToAllTokenDispatcher::exchange(const at::Tensor& sorted,
                                                       const std::vector<int64_t>& tokens_per_expert) {
  const int p = group_.size(), me = group_.rank();
  const auto experts = static_cast<int64_t>(tokens_per_expert.size());
  const ChunkRange mine = chunk_range(experts, p, me);
  // Counts first: rank r receives, from every rank, the counts of the experts it holds.
  std::vector<int64_t> count_splits(p), count_arrivals(p, mine.size);
  send_splits_.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    const ChunkRange theirs = chunk_range(experts, p, r);
    count_splits[r] = theirs.size;
    for (int64_t e = theirs.offset; e < theirs.offset + theirs.size; ++e) send_splits_[r] += tokens_per_expert[e];
  }
  at::Tensor counts = at::tensor(tokens_per_expert, at::kLong);
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor arrived = observe_collective("expert counts all_to_all", counts, [&] {
                         return comm::all_to_all(counts, group_, 0, 0, count_splits, count_arrivals);
                       }).view({p, mine.size});
  *seconds_ += since(t0);
  if (sorted.is_meta()) {  // a dry-run: every rank routes alike, so each sends what this one does
    arrived = at::empty({p, mine.size}, at::kLong);
    for (int s = 0; s < p; ++s)
      for (int64_t e = 0; e < mine.size; ++e) arrived[s][e] = tokens_per_expert[mine.offset + e];
  }
  const int64_t* a = arrived.data_ptr<int64_t>();
  recv_splits_.assign(p, 0);
  for (int s = 0; s < p; ++s)
    for (int64_t e = 0; e < mine.size; ++e) recv_splits_[s] += a[s * mine.size + e];

  at::Tensor received = exchange_rows(sorted, group_, send_splits_, recv_splits_, seconds_);
  sent_ = sorted.size(0);
  received_ = received.size(0);
  local_ = send_splits_[group_.rank()];

  std::vector<int64_t> per_expert;
  by_expert_ = expert_major_order(a, p, mine.size, &per_expert).to(sorted.device());
  return {nn::select_rows(received, by_expert_), per_expert};
}

at::Tensor AllToAllTokenDispatcher::exchange_back(const at::Tensor& expert_out) {
  at::Tensor by_source = nn::place_rows(expert_out, by_expert_, expert_out.size(0));
  return exchange_rows(by_source, group_, recv_splits_, send_splits_, seconds_);
}

}  // namespace hp
