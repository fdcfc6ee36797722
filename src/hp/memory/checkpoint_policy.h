// Selective activation checkpointing: per op of a checkpointed region, whether its output
// is kept for backward or recomputed (torch.utils.checkpoint's CheckpointPolicy).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "hp/layout/sharding_rules.h"

namespace hp {

enum class CheckpointPolicy {
  MUST_SAVE,         // kept, whatever the memory budget
  PREFER_SAVE,       // kept, unless a memory budget needs the room
  MUST_RECOMPUTE,    // recomputed, whatever the budget
  PREFER_RECOMPUTE,  // recomputed, unless a memory budget has room to keep it
  MUST_SWAP,         // written to CheckpointOptions::swap_tier after the forward, read back in the replay
};

// What a policy sees of one op of the region, after the forward ran it.
struct CheckpointOp {
  std::string name;              // "linear", "attention", "rms_norm", "swiglu", "rotary", "add",
                                 // "view(2, 256, 256)", "redistribute P(sum) -> R"
  std::optional<OpKind> kind;    // the sharding rule it runs under (rms_norm and swiglu: Mul,
                                 // rotary: Softmax); unset for a redistribution
  bool collective = false;       // a redistribution that moves data between ranks, or another
                                 // observed collective (a MoE token exchange)
  int64_t bytes = 0;             // of its output
  bool is_matmul() const {
    return kind && (*kind == OpKind::Matmul || *kind == OpKind::Linear || *kind == OpKind::Attention);
  }
};

using CheckpointPolicyFn = std::function<CheckpointPolicy(const CheckpointOp&)>;

// The default: keep the outputs of matmuls (Linear, Matmul, Attention) and of collectives,
// recompute the rest (elementwise ops, norms, softmax, views); no collective runs twice.
CheckpointPolicy save_matmuls_and_collectives(const CheckpointOp& op);

}  // namespace hp
