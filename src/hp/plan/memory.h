// Per-rank memory of one pipeline rank: weights, gradients, optimizer states,
// activations and the transient buffers of fully sharded units.
// Precision: bf16 weights and activations, fp32 gradients, AdamW with fp32 master
// weights, m and v (12 bytes per parameter).
#pragma once

#include <cstdint>

#include "hp/plan/model_desc.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/plan/strategy.h"

namespace hp::plan {

constexpr double kParamBytes = 2;
constexpr double kGradBytes = 4;
constexpr double kOptimizerBytes = 12;
constexpr double kActivationBytes = 2;

// Saved activations of one layer per token, before the tp split, in bytes. With flash
// attention (no s^2 scores kept), h = hidden, q/kv = projection widths, f = ffn:
//   none:      2h norm-in + 2h norm-out + 2(q+2kv) q,k,v + 2q attn-out + 4*heads logsumexp
//              + 2h norm2-in + 2h norm2-out + 6f (gate, up, act*up)
//   MoE FFN instead of 6f: 4E router logits (fp32) + 2hk dispatched + 6F(k+shared) + 2hk combine,
//              with F = moe_ffn, k = top_k
//   selective: drops what is cheap to recompute: both norm outputs and act*up
//              (none - 4h - 2f, or - 2F(k+shared) for MoE)
//   full:      2h, the layer input
// Korthikanti et al. (2022) count the same tensors for GPT (34·s·b·h without attention
// scores); sequence parallelism divides all of them by tp.
double layer_activation_bytes_per_token(const ModelDesc& m, bool moe_layer, Recompute r);

// Parameters (elements) that one rank of a pipeline stage holds before any FSDP sharding.
struct StageParams {
  double dense = 0;    // replicated over dp*ep*cp
  double expert = 0;   // replicated over dp*cp (split over ep already)
  double largest_unit = 0;  // biggest FSDP unit (a layer, the embedding or the head), on this rank
};
StageParams stage_params(const ModelDesc& m, const Strategy& s, const StageContents& stage);

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, logits = 0, fsdp_buffers = 0;  // bytes
  int64_t stage = 0;  // pipeline rank this breakdown is for
  double total() const { return params + grads + optimizer + activations + logits + fsdp_buffers; }
};

// Memory of pipeline rank `index` (holding `stage`) under resolved strategy `s`.
MemoryBreakdown stage_memory(const ModelDesc& m, const Strategy& s, const StageContents& stage, int64_t index);

}  // namespace hp::plan
