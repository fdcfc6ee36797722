// Expert parallelism's token exchange: experts are split over the ranks of a group in
// torch.chunk pieces (as a Shard(0) parameter is), and each rank's tokens, sorted by
// expert, travel to the ranks holding their experts and back. Token counts go first (one
// small all-to-all), then the tokens in one all-to-all with uneven splits; its backward
// is the inverse all-to-all. No token is gathered anywhere.
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

  // Rows this rank sent and received in the last dispatch's token all-to-all.
  int64_t rows_sent() const { return sent_; }
  int64_t rows_received() const { return received_; }
  // Wall time this rank spent in the dispatcher's all-to-alls (counts and rows, forward
  // and backward) since construction or the last reset: the exchange's share of a step.
  double all_to_all_seconds() const { return *seconds_; }
  void reset_all_to_all_seconds() { *seconds_ = 0; }

 protected:
  nn::DispatchedTokens exchange(const at::Tensor& sorted, const std::vector<int64_t>& tokens_per_expert) override;
  at::Tensor exchange_back(const at::Tensor& expert_out) override;

 private:
  const comm::Group& group_;
  std::vector<int64_t> send_splits_, recv_splits_;  // rows per peer rank
  at::Tensor by_expert_;  // received rows reordered from (source, expert) to (expert, source)
  int64_t sent_ = 0, received_ = 0;
  std::shared_ptr<double> seconds_ = std::make_shared<double>(0);  // shared with backward closures
};

}  // namespace hp
