// Expert parallelism's token exchange: experts are split over the ranks of a group in
// torch.chunk pieces (as a Shard(0) parameter is), and each rank's tokens, sorted by
// expert, travel to the ranks holding their experts and back. Token counts go first (one
// small all-to-all), then the tokens in one all-to-all with uneven splits; its backward
// is the inverse all-to-all. No token is gathered anywhere.
//
// With num_chunks > 1 the dispatcher runs the experts itself (token_dispatcher_chunks.cpp):
// the rows bound for this rank's own experts stay, half of them run first and half last,
// while the others go out in chunks, every chunk's all-to-all posted at once on the
// progress engine; each chunk's experts run as soon as it lands and its outputs go back at
// once, behind the next chunk's experts. The backward does the same in reverse.
#pragma once

#include <memory>

#include "hp/comm/group.h"
#include "hp/nn/token_dispatcher.h"

namespace hp {

class AllToAllTokenDispatcher : public nn::TokenDispatcher {
 public:
  // `group` outlives the dispatcher (a mesh dim's group).
  AllToAllTokenDispatcher(const comm::Group& group, nn::TokenDispatcherOptions options = {})
      : TokenDispatcher(options), group_(group) {}

  bool pipelines() const override { return options().num_chunks > 1; }
  at::Tensor run_experts(const at::Tensor& sorted, const nn::ExpertFunction& experts,
                         const std::function<void()>& behind_exchange) override;

  // Rows this rank sent and received in the last dispatch's token all-to-all(s).
  int64_t rows_sent() const { return sent_; }
  int64_t rows_received() const { return received_; }
  // Of those, the rows bound for this rank's own experts (chunked, they skip the exchange).
  int64_t rows_local() const { return local_; }
  // Wall time this rank spent in the dispatcher's all-to-alls (counts and rows, forward
  // and backward; chunked, the time it waited on them) since construction or the last
  // reset: the exchange's exposed share of a step.
  double all_to_all_seconds() const { return *seconds_; }
  void reset_all_to_all_seconds() { *seconds_ = 0; }

  struct ChunkPlan;  // token_dispatcher_chunks.h

 protected:
  nn::DispatchedTokens exchange(const at::Tensor& sorted, const std::vector<int64_t>& tokens_per_expert) override;
  at::Tensor exchange_back(const at::Tensor& expert_out) override;

 private:
  ChunkPlan plan_chunks(int64_t chunks);
  at::Tensor run_chunked(const at::Tensor& sorted, const nn::ExpertFunction& experts,
                         const std::function<void()>& behind_exchange);

  const comm::Group& group_;
  std::vector<int64_t> send_splits_, recv_splits_;  // rows per peer rank
  at::Tensor by_expert_;  // received rows reordered from (source, expert) to (expert, source)
  int64_t sent_ = 0, received_ = 0, local_ = 0;
  std::shared_ptr<double> seconds_ = std::make_shared<double>(0);  // shared with backward closures
};

}  // namespace hp
