// The shape of a mixture-of-experts layer. Plain data with no LibTorch include, so the
// trainer's config (torch-free) describes the model with this very struct.
#pragma once

#include <cstdint>
#include <string>

#include "hp/base/error.h"

namespace hp::nn {

struct MoEOptions {
  int64_t num_experts = 8;
  int64_t top_k = 2;
  int64_t num_shared_experts = 0;   // always-on SwiGLU experts, hidden_dim each, fused into one
  std::string score_func = "softmax";  // "softmax" or "sigmoid" (DeepSeek-V3)
  bool route_norm = false;          // renormalise the top-k scores to sum to 1
  double route_scale = 1.0;         // multiplies the routing weights
  // Group-limited routing (DeepSeek-V3): experts in num_expert_groups groups, each token
  // picks among the experts of its num_limited_groups best groups. 0: off.
  int64_t num_expert_groups = 0;
  int64_t num_limited_groups = 0;
  double aux_loss_coef = 0;         // Switch-style load-balancing loss over the batch; 0: off
  bool load_balance_bias = false;   // auxiliary-loss-free balancing: a bias on selection scores
  double bias_update_rate = 1e-3;   // step of update_expert_bias
  // Tokens an expert accepts from one rank's batch: ceil(factor * T * top_k / experts);
  // later tokens (in token order) are dropped. 0: dropless.
  double capacity_factor = 0;
  // Expert parallelism: the routed tokens go out and come back in this many chunks (split
  // by token), one chunk's exchange running while another's experts compute (first those
  // of the tokens bound for the rank's own experts, which stay), the shared experts behind
  // the last exchange. 1: one exchange each way.
  int64_t num_chunks = 1;

  void validate() const;  // throws naming the inconsistent fields
};

inline void MoEOptions::validate() const {
  HP_CHECK(num_experts > 0 && top_k > 0) << "MoE needs num_experts > 0 and top_k > 0, got num_experts "
                                         << num_experts << ", top_k " << top_k;
  HP_CHECK(top_k <= num_experts) << "MoE top_k " << top_k << " exceeds num_experts " << num_experts;
  HP_CHECK(score_func == "softmax" || score_func == "sigmoid")
      << "MoE score_func must be \"softmax\" or \"sigmoid\", got \"" << score_func << "\"";
  HP_CHECK(num_shared_experts >= 0) << "MoE num_shared_experts must be >= 0, got " << num_shared_experts;
  HP_CHECK(num_chunks >= 1) << "MoE num_chunks must be >= 1 (1: unchunked), got " << num_chunks;
  HP_CHECK(capacity_factor >= 0) << "MoE capacity_factor must be >= 0 (0: dropless), got " << capacity_factor;
  if (num_expert_groups > 0) {
    HP_CHECK(num_experts % num_expert_groups == 0)
        << "MoE num_experts " << num_experts << " must be a multiple of num_expert_groups " << num_expert_groups;
    HP_CHECK(num_limited_groups > 0 && num_limited_groups <= num_expert_groups)
        << "MoE num_limited_groups " << num_limited_groups << " must be in [1, num_expert_groups "
        << num_expert_groups << "]";
    HP_CHECK(top_k <= num_limited_groups * (num_experts / num_expert_groups))
        << "MoE top_k " << top_k << " exceeds the " << num_limited_groups * (num_experts / num_expert_groups)
        << " experts of the " << num_limited_groups << " groups a token may use";
  } else {
    HP_CHECK(num_limited_groups == 0) << "MoE num_limited_groups " << num_limited_groups
                                      << " needs num_expert_groups > 0";
  }
}

}  // namespace hp::nn
