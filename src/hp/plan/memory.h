// Per-rank memory of one pipeline rank: weights, gradients, optimizer states,
// activations and the transient buffers of fully sharded units.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hp/plan/model_desc.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/plan/strategy.h"

namespace hp::plan {

// How a runtime stores a step: bytes per element, and which activations it keeps.
struct Numerics {
  std::string name = "bf16-flash";
  double param_bytes = 2;       // the weights computed with
  double grad_bytes = 4;
  double optimizer_bytes = 12;  // AdamW: fp32 master weights, m and v
  double activation_bytes = 2;
  // false: fused kernels (flash attention, fused norms), counted by
  // layer_activation_bytes_per_token. true: hp::nn's eager ops, which keep each unfused
  // op's inputs (eager_layer_activation_elements; attention is SDPA's flash kernel).
  bool eager = false;
  bool ddp_buckets = false;     // data parallelism keeps a flat copy of the gradients
};
// "bf16-flash": a GPU run in bfloat16 with fp32 master weights (the default).
// "fp32-eager": hp::nn on CPUs: float32 throughout, AdamW's m and v, our DDP's buckets.
std::vector<std::string> numerics_preset_names();
Numerics numerics_preset(const std::string& name);  // throws listing the presets

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

// Elements one layer of hp::nn's Llama (dense) or MoELlama (moe_layer) keeps for backward
// per token of a rank's microbatch, with tp = `tp` (sequence parallel when tp > 1 for the
// dense layer); see memory.cpp for the count.
double eager_layer_activation_elements(const ModelDesc& m, int64_t tp, bool moe_layer = false);
// The same under hp::memory's selective checkpointing with its default policy
// (save_matmuls_and_collectives): only the outputs of matmuls and collectives that backward
// or the recompute reads stay, with the layer's input. In a MoE layer the attention half
// goes as a dense layer's; the routing, dispatch and experts are not observed ops, so what
// they save stays.
double eager_selective_layer_activation_elements(const ModelDesc& m, int64_t tp, bool moe_layer = false);

// Parameters (elements) that one rank of a pipeline stage holds before any FSDP sharding.
struct StageParams {
  double dense = 0;    // replicated over dp*ep*cp
  double expert = 0;   // replicated over dp*cp (split over ep already)
  double largest_unit = 0;  // biggest FSDP unit (a layer, the embedding or the head), on this rank
};
StageParams stage_params(const ModelDesc& m, const Strategy& s, const StageContents& stage);

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, logits = 0, zero_buffers = 0;  // bytes
  double ddp_buckets = 0;  // flat gradient copies of data parallelism (Numerics::ddp_buckets)
  // A pipeline stage's received inputs not yet in a running forward, and the outputs it
  // sent with the buffers posted for their gradients.
  double stage_inputs = 0;
  // How gradients and activations meet. The optimizer step frees the gradients
  // (zero_grad), and a step's backward brings them back layer by layer as it frees that
  // layer's activations. With one microbatch the step's peak is at one end of the backward:
  // at its start, every activation beside the head's gradients only
  // (grads_at_activation_peak), or at its last layer, every gradient beside that layer's
  // activations and whatever the backward rematerializes for it
  // (activations_at_gradient_peak). With several microbatches the first ones' gradients
  // wait beside the later ones' activations: both are the whole.
  double grads_at_activation_peak = 0;
  double activations_at_gradient_peak = 0;
  int64_t stage = 0;  // pipeline rank this breakdown is for
  // What the activations' peak holds besides gradients.
  double with_activations() const { return activations + logits + stage_inputs; }
  double total() const {
    const double varying =
        std::max(grads_at_activation_peak + with_activations(), grads + activations_at_gradient_peak);
    return params + optimizer + zero_buffers + ddp_buckets + varying;
  }
};

// Memory of pipeline rank `index` (holding `stage`) under resolved strategy `s`, which
// keeps `inflight` microbatches of activations through its layers at its peak
// (inflight_microbatches, pipeline_profile.h).
MemoryBreakdown stage_memory(const ModelDesc& m, const Strategy& s, const StageContents& stage, int64_t index,
                             double inflight, const Numerics& n = {});

}  // namespace hp::plan
