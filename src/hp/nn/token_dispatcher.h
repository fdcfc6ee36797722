// Moves a rank's routed tokens to the experts that process them and back. This base
// class keeps every expert local (one process, or experts replicated); expert
// parallelism (hp::parallel::AllToAllTokenDispatcher) overrides the exchange in the middle.
//
// dispatch: the T x top_k assignments are sorted by expert (stable, so token order within
// an expert), assignments over an expert's capacity are dropped, the tokens are gathered
// in that order and exchanged. combine: the inverse, giving [T, top_k, D] with zeros for
// dropped assignments. State of the last dispatch is kept for its combine, so one
// dispatcher serves one layer. On meta tensors (a dry-run) the assignments are taken to
// be spread evenly over the experts.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hp::nn {

struct TokenDispatcherOptions {
  double capacity_factor = 0;  // 0: dropless (see MoEOptions::capacity_factor)
};

struct DispatchedTokens {
  at::Tensor tokens;                      // [N, D], grouped by this rank's experts in order
  std::vector<int64_t> tokens_per_expert; // one count per expert this rank holds
};

// x.index_select(0, index). Meta tensors (a dry-run) have no such kernel: there, a tensor
// of the result's shape that autograd links to x.
at::Tensor select_rows(const at::Tensor& x, const at::Tensor& index);
// A [rows, D] tensor of zeros with src's rows at `index` (index_copy); on meta tensors,
// the shape linked to src.
at::Tensor place_rows(const at::Tensor& src, const at::Tensor& index, int64_t rows);

class TokenDispatcher {
 public:
  explicit TokenDispatcher(TokenDispatcherOptions options = {}) : options_(options) {}
  virtual ~TokenDispatcher() = default;

  // tokens [T, D]; indices [T, top_k] of global expert ids in [0, num_experts).
  DispatchedTokens dispatch(const at::Tensor& tokens, const at::Tensor& indices, int64_t num_experts);
  // expert outputs [N, D] in dispatch's order -> [T, top_k, D].
  at::Tensor combine(const at::Tensor& expert_out);

  // Of the last dispatch, over this rank's assignments.
  int64_t dropped() const { return dropped_; }
  double drop_rate() const { return assignments_ ? double(dropped_) / double(assignments_) : 0.0; }
  const TokenDispatcherOptions& options() const { return options_; }

 protected:
  // Tokens sorted by global expert with their per-expert counts -> tokens grouped by this
  // rank's experts; and its inverse. Local: the identity.
  virtual DispatchedTokens exchange(const at::Tensor& sorted, const std::vector<int64_t>& tokens_per_expert);
  virtual at::Tensor exchange_back(const at::Tensor& expert_out);

 private:
  int64_t capacity_of(int64_t num_experts) const;
  DispatchedTokens dispatch_even(const at::Tensor& tokens, int64_t num_experts);
  TokenDispatcherOptions options_;
  at::Tensor kept_;  // [kept] positions in the flattened [T * top_k] assignments, sorted by expert
  int64_t num_tokens_ = 0, top_k_ = 0, dropped_ = 0, assignments_ = 0;
};

}  // namespace hp::nn
