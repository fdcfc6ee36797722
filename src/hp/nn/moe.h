// Mixture of experts: a token-choice top-k router, SwiGLU experts computed as grouped
// products over tokens sorted by expert, optional shared experts. Written once with no
// parallelism in it: expert parallelism shards the experts' parameters and swaps in a
// token dispatcher from outside (hp::ExpertParallel).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "hp/nn/layers.h"
#include "hp/nn/moe_aux_loss.h"
#include "hp/nn/moe_options.h"
#include "hp/nn/token_dispatcher.h"
#include "hp/nn/transformer.h"

namespace hp::nn {

struct Routing {
  at::Tensor indices;  // [T, top_k] expert ids, this rank's tokens
  at::Tensor weights;  // [T, top_k] routing weights (differentiable)
  // With MoEOptions::aux_loss_coef > 0: this rank's share of the load-balancing loss's two
  // batch sums per expert [2E] (assignments, then scores), partial over the mesh dims the
  // tokens are split over, and the loss's scale (AuxLoss).
  std::optional<DTensor> aux_sums;
  double aux_scale = 0;
};

// Scores tokens [T, D] against every expert (a bias-free Linear "gate") and picks top_k.
class TokenChoiceTopKRouter : public Module {
 public:
  TokenChoiceTopKRouter(int64_t dim, const MoEOptions& options, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;  // [T, D] -> scores [T, E] (softmax or sigmoid)
  Routing route(const DTensor& x);

  // Auxiliary-loss-free balancing: the bias is added to the scores that select experts
  // (never to the routing weights) and moved by update_expert_bias toward equal loads.
  // A buffer ("expert_bias", replicated), so checkpoints keep it.
  const at::Tensor& expert_bias() const { return expert_bias_->to_local(); }
  // Tokens each expert received since the last take, summed over every rank holding
  // other tokens (the mesh dims the router's input is split over): the same on all ranks.
  // The counts restart. Several routers' in one all-reduce where their tokens are split alike.
  static std::vector<at::Tensor> take_tokens_per_expert(const std::vector<TokenChoiceTopKRouter*>& routers);
  at::Tensor take_tokens_per_expert() { return take_tokens_per_expert({this}).front(); }
  // bias += rate * sign(mean load - load), `loads` from take_tokens_per_expert.
  void update_expert_bias(const at::Tensor& loads);

 private:
  MoEOptions o_;
  std::shared_ptr<Linear> gate_;
  DTensor* expert_bias_;             // [E] float
  at::Tensor pending_counts_;        // [E] float, this rank's tokens since the last update
  std::optional<DeviceMesh> mesh_;   // of the last input, and the dims its tokens are split over
  std::vector<int> split_dims_;
};

// SwiGLU experts: w1, w3 [E, H, D] and w2 [E, D, H] (a Linear's [out, in] per expert).
class GroupedExperts : public Module {
 public:
  GroupedExperts(int64_t dim, int64_t hidden_dim, int64_t num_experts, const DeviceMesh& mesh);
  // Experts need their tokens grouped by expert: call run (MoE does), which comes here
  // through the module's hooks.
  DTensor forward(const DTensor& x) override;
  // tokens [N, D] grouped by the experts this rank holds (tokens_per_expert of them, in
  // order); `token_layout` is how the tokens before dispatch were laid out over the mesh.
  // Experts sharded on E (expert parallel) see every token routed to them; sharded on H
  // (expert tensor parallel) they see the tokens whole and sum their partial outputs.
  at::Tensor run(const at::Tensor& tokens, const std::vector<int64_t>& tokens_per_expert,
                 const std::vector<Placement>& token_layout);
  // The same with the dispatcher around the experts: `sorted` is dispatcher.sort's output,
  // the result run_experts' (the module's hooks see those two).
  at::Tensor run_through(TokenDispatcher& dispatcher, const at::Tensor& sorted,
                         const std::vector<Placement>& token_layout, const std::function<void()>& behind_exchange);
  DTensor& w1() { return *w1_; }
  DTensor& w2() { return *w2_; }
  DTensor& w3() { return *w3_; }

 private:
  ExpertFunction function(const std::vector<Placement>& token_layout);
  struct Grouping {
    std::vector<int64_t> tokens_per_expert;
    std::vector<Placement> token_layout;
    TokenDispatcher* through = nullptr;  // run_through's
    std::function<void()> behind_exchange;
  };
  std::optional<Grouping> grouping_;  // of the call in progress
  DTensor *w1_, *w2_, *w3_;
};

// x [N, K] grouped into G consecutive row blocks of counts[g] rows, block g times w[g]
// (w [G, K, M], any strides) -> [N, M]. at::_grouped_mm where LibTorch's kernel takes the
// dtype and alignment, else one product per group over its contiguous rows.
at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const std::vector<int64_t>& counts);

class MoE : public Module {
 public:
  MoE(int64_t dim, int64_t hidden_dim, const MoEOptions& options, const DeviceMesh& mesh);
  DTensor forward(const DTensor& x) override;  // [..., D] -> [..., D]

  // The dispatcher between router and experts; the default keeps every expert local.
  void set_token_dispatcher(std::shared_ptr<TokenDispatcher> dispatcher) { dispatcher_ = std::move(dispatcher); }
  TokenDispatcher& token_dispatcher() { return *dispatcher_; }
  // The load-balancing loss of the last forward (already times aux_loss_coef). Reading it
  // reduces its batch sums over the ranks unless moe_aux_loss did: every rank must read it.
  std::optional<DTensor> aux_loss() { return aux_loss_ ? std::optional<DTensor>(aux_loss_->value()) : std::nullopt; }
  // scale > 0: the auxiliary loss's gradient enters at this layer's output instead
  // (carry_aux_loss, as if scale * aux had been added to the loss) and aux_loss() is its
  // detached value: the gradient then reaches the router wherever the loss is (another
  // pipeline stage) and whenever the layer's graph is built (in a checkpoint's recompute).
  void set_aux_loss_carry(double scale) { aux_loss_carry_ = scale; }
  const MoEOptions& options() const { return o_; }
  TokenChoiceTopKRouter& router() { return *router_; }
  GroupedExperts& experts() { return *experts_; }

 private:
  MoEOptions o_;
  std::shared_ptr<TokenChoiceTopKRouter> router_;
  std::shared_ptr<GroupedExperts> experts_;
  std::shared_ptr<MLP> shared_experts_;
  std::shared_ptr<TokenDispatcher> dispatcher_;
  friend std::optional<DTensor> moe_aux_loss(Module& model);
  std::shared_ptr<AuxLoss> aux_loss_;  // the last forward's
  double aux_loss_carry_ = 0;
};

// Every MoE layer under `model`.
std::vector<MoE*> moe_layers(Module& model);
// After the optimizer step: update_expert_bias on the routers that balance by bias, and
// take the loads of the others. Returns the largest max / mean expert load of the layers.
double update_expert_bias(Module& model);
// The sum of the MoE layers' auxiliary losses of the last forward, if any: their batch
// sums reduced in one all-reduce (reduce_aux_losses).
std::optional<DTensor> moe_aux_loss(Module& model);

}  // namespace hp::nn
