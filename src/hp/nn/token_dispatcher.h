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
//
// A dispatcher may also run the experts itself between its two exchanges (run_experts),
// so that it can split the work in chunks and overlap one chunk's exchange with another's
// experts; MoE calls sort, run_experts and unsort then (pipelines()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace hp::nn {

struct TokenDispatcherOptions {
  double capacity_factor = 0;  // 0: dropless (see MoEOptions::capacity_factor)
  int64_t num_chunks = 1;      // see MoEOptions::num_chunks
};

// The experts as a function: tokens grouped by this rank's experts (tokens_per_expert of
// them) and the tensors they read that need gradients -> their outputs. A dispatcher that
// pipelines runs it once per chunk, on leaves standing for `weights`.
struct ExpertFunction {
  std::function<at::Tensor(const at::Tensor& tokens, const std::vector<int64_t>& tokens_per_expert,
                           const std::vector<at::Tensor>& weights)>
      run;
  std::vector<at::Tensor> weights;
};

struct DispatchedTokens {
  at::Tensor tokens;                      // [N, D], grouped by this rank's experts in order
  std::vector<int64_t> tokens_per_expert; // one count per expert this rank holds
};

// x.index_select(0, index), its backward keeping only the index. On meta tensors (a
// dry-run), storage of the result's shape.
at::Tensor select_rows(const at::Tensor& x, const at::Tensor& index);
// A [rows, D] tensor of zeros with src's rows at `index` (index_copy), its backward keeping
// only the index (not src, as ATen's would); on meta tensors, zeros of that shape.
at::Tensor place_rows(const at::Tensor& src, const at::Tensor& index, int64_t rows);
// The experts' outputs [T, top_k, D] weighted by the routing weights [T, top_k] and summed
// over the choices: (outputs * weights[..., None]).sum(1), whose backward holds one
// [T, top_k, D] tensor at a time where autograd's product rule holds two.
at::Tensor weighted_sum_of_choices(const at::Tensor& outputs, const at::Tensor& weights);

class TokenDispatcher {
 public:
  explicit TokenDispatcher(TokenDispatcherOptions options = {}) : options_(options) {}
  virtual ~TokenDispatcher() = default;

  // tokens [T, D]; indices [T, top_k] of global expert ids in [0, num_experts).
  DispatchedTokens dispatch(const at::Tensor& tokens, const at::Tensor& indices, int64_t num_experts);
  // expert outputs [N, D] in dispatch's order -> [T, top_k, D].
  at::Tensor combine(const at::Tensor& expert_out);

  // The same in three steps, the experts run by the dispatcher: sort routes (capacity
  // applied) and gathers the kept assignments' tokens [kept, D] in expert order;
  // run_experts exchanges them, runs `experts` and exchanges the outputs back ([kept, D] in
  // sort's order), calling `behind_exchange` (if set) while the last exchange is in flight;
  // unsort gives [T, top_k, D]. Here: dispatch's exchange, experts, combine's exchange.
  virtual bool pipelines() const { return false; }
  at::Tensor sort(const at::Tensor& tokens, const at::Tensor& indices, int64_t num_experts);
  virtual at::Tensor run_experts(const at::Tensor& sorted, const ExpertFunction& experts,
                                 const std::function<void()>& behind_exchange);
  at::Tensor unsort(const at::Tensor& back);

  // Of the last dispatch, over this rank's assignments.
  int64_t dropped() const { return dropped_; }
  double drop_rate() const { return assignments_ ? double(dropped_) / double(assignments_) : 0.0; }
  const TokenDispatcherOptions& options() const { return options_; }

 protected:
  // Tokens sorted by global expert with their per-expert counts -> tokens grouped by this
  // rank's experts; and its inverse. Local: the identity.
  virtual DispatchedTokens exchange(const at::Tensor& sorted, const std::vector<int64_t>& tokens_per_expert);
  virtual at::Tensor exchange_back(const at::Tensor& expert_out);
  // Of the last sort: tokens per global expert, and the token (row of `tokens`) of each
  // sorted row.
  const std::vector<int64_t>& sorted_per_expert() const { return per_expert_; }
  at::Tensor sorted_token_ids() const;
  int64_t num_tokens() const { return num_tokens_; }

 private:
  int64_t capacity_of(int64_t num_experts) const;
  at::Tensor sort_even(const at::Tensor& tokens, int64_t num_experts);
  TokenDispatcherOptions options_;
  std::vector<int64_t> per_expert_;  // kept assignments per global expert
  at::Tensor kept_;  // [kept] positions in the flattened [T * top_k] assignments, sorted by expert
  int64_t num_tokens_ = 0, top_k_ = 0, dropped_ = 0, assignments_ = 0;
};

}  // namespace hp::nn
