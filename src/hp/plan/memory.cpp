#include "hp/plan/memory.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp::plan {
namespace {

// The token chunks a layer's MLP is recomputed in: full_chunked's, but whole sequences only
// under sequence parallelism (the MLP's output is its input's sequences, half of each one's
// tokens).
double mlp_chunks(const ModelDesc& m, const Strategy& s) {
  if (s.recompute != Recompute::FullChunked) return 1;
  const int64_t chunks = runs_sequence_parallel(s, m.is_moe()) ? std::min(kRecomputeTokenChunks, s.micro_batch)
                                                               : kRecomputeTokenChunks;
  return double(std::max<int64_t>(chunks, 1));
}

}  // namespace

std::vector<std::string> numerics_preset_names() { return {"bf16-flash", "fp32-eager"}; }

Numerics numerics_preset(const std::string& name) {
  if (name == "bf16-flash") return Numerics{};
  if (name == "fp32-eager") {
    Numerics n;
    n.name = name;
    n.param_bytes = n.grad_bytes = n.activation_bytes = 4;
    n.optimizer_bytes = 8;
    n.eager = n.ddp_buckets = true;
    return n;
  }
  HP_FAIL() << "unknown numerics '" << name << "'; presets: " << to_string_list(numerics_preset_names());
  return {};
}

double layer_activation_bytes_per_token(const ModelDesc& m, bool moe_layer, Recompute r) {
  const double h = m.hidden, q = m.q_dim(), kv = m.kv_dim();
  if (recomputes_whole_layers(r)) return 2 * h;
  double attn = 2 * h + 2 * h + 2 * (q + 2 * kv) + 2 * q + 4.0 * m.heads;
  double ffn_in = 2 * h + 2 * h;
  double ffn = 0, cheap_ffn = 0;
  if (moe_layer) {
    const double k = m.top_k, act = m.moe_ffn * double(m.top_k + m.shared_experts);
    ffn = 4.0 * m.experts + 2 * h * k + 6 * act + 2 * h * k;
    cheap_ffn = 2 * act;
  } else {
    ffn = 6.0 * m.ffn;
    cheap_ffn = 2.0 * m.ffn;
  }
  double all = attn + ffn_in + ffn;
  if (r == Recompute::Selective) all -= 4 * h + cheap_ffn;
  return all;
}

double eager_layer_activation_elements(const ModelDesc& m, int64_t tp, bool moe_layer) {
  HP_CHECK(!moe_layer || m.is_moe()) << "model " << m.name << " has no MoE layer";
  const double t = double(tp), h = m.hidden, q = m.q_dim() / t, kv = m.kv_dim() / t, f = m.ffn / t;
  const double heads = m.heads / t;
  // Each RMSNorm (one pass, hp::fused) keeps its input and 1/rms (sequence-sharded under
  // sequence parallelism), and its output is the input of the projections, which keep it
  // whole (all-gathered) when tp > 1.
  const double norm = h / t + 1 / t + h;
  // The attention: rotary's outputs, which scaled_dot_product_attention keeps with v,
  // and its output and one log-sum-exp per head (a flash kernel: no s x s probabilities):
  // 2q + 2kv, as measured. o_proj reads the output through a view, not a copy: rotary
  // keeps the projection's [B, S, H, D] layout and the kernel lays its output out as its
  // queries. Rotary keeps nothing of q and k, one pass or composed: its products are by
  // tables that need no gradient.
  const double attn = q + kv + kv + q + heads;
  // SwiGLU (one pass, hp::fused): gate and up projections and their silu-product
  // (down_proj's input); silu's output is not kept.
  double mlp = 3 * f;
  if (moe_layer) {
    // hp::nn::MoE: the router's scores and one-hot choices (E each) and the routing
    // weights (k); per routed copy of a token the experts' input and the combined output
    // before weighting (2h) and SwiGLU's 3 on the expert width (split over tp by expert
    // tensor parallelism); the shared experts' SwiGLU.
    const double k = m.top_k, width = m.moe_ffn / t;
    mlp = 2.0 * m.experts + k + k * (2 * h + 3 * width) + 3.0 * m.shared_experts * width;
  }
  return 2 * norm + attn + mlp;
}

double eager_selective_layer_activation_elements(const ModelDesc& m, int64_t tp, bool moe_layer) {
  const double t = double(tp), h = m.hidden, q = m.q_dim() / t, kv = m.kv_dim() / t, f = m.ffn / t;
  // The layer's input and the attention output's reduce-scatter (h/t each: the residual
  // sum the second norm recomputes from); rotary's q and k (kept in place of the
  // projections', which only rotary reads), v and the attention output with one
  // log-sum-exp per head; gate and up. Under sequence parallelism each norm's
  // all-gathered output (h) is a collective's and stays too.
  const double gathered = tp > 1 ? 2 * h : 0;
  const double dense = 2 * h / t + gathered + 2 * q + 2 * kv + m.heads / t + 2 * f;
  if (!moe_layer) return dense;
  // The dense layer's count less its SwiGLU's, with and without the checkpointing, gives
  // the attention half's; the MoE half keeps all it keeps uncheckpointed.
  const double attention_all = eager_layer_activation_elements(m, tp) - 3 * f;
  return eager_layer_activation_elements(m, tp, true) - attention_all + (dense - 2 * f);
}

StageParams stage_params(const ModelDesc& m, const Strategy& s, const StageContents& st) {
  const ParamCounts pc = count_params(m);
  const double h = m.hidden, t = s.tp;
  // q and o split over tp; k and v too, until tp exceeds kv_heads and heads get replicated.
  const double kv_split = std::min<double>(t, m.kv_heads);
  const double attn = 2 * h * m.q_dim() / t + 2 * h * m.kv_dim() / kv_split + 2 * h;
  const double dense_mlp = pc.dense_mlp / t;
  const double moe_shared = h * m.experts + m.shared_experts * 3 * h * m.moe_ffn / t;  // router replicated
  const double experts = double(m.experts) / s.ep * pc.moe_expert / t;
  const double emb = double(pc.embedding) / t;                // vocab-parallel
  const double head = double(m.vocab) * h / t + h;            // a tied head still needs its own copy
  const bool head_shares_embedding = m.tied_embeddings && st.embedding;

  StageParams p;
  p.dense = st.layers() * attn + st.dense_layers * dense_mlp + st.moe_layers * moe_shared;
  p.expert = st.moe_layers * experts;
  if (st.embedding) p.dense += emb;
  if (st.head) p.dense += head_shares_embedding ? h : head;
  if (st.dense_layers) p.largest_unit = std::max(p.largest_unit, attn + dense_mlp);
  if (st.moe_layers) p.largest_unit = std::max(p.largest_unit, attn + moe_shared + experts);
  if (st.embedding) p.largest_unit = std::max(p.largest_unit, emb);
  if (st.head) p.largest_unit = std::max(p.largest_unit, head);
  return p;
}

MemoryBreakdown stage_memory(const ModelDesc& m, const Strategy& s, const StageContents& st, int64_t index,
                             double inflight, const Numerics& n) {
  MemoryBreakdown mem;
  mem.stage = index;
  const StageParams p = stage_params(m, s, st);
  const double whole = p.dense + p.expert;
  const double shard = p.dense / double(s.dp * s.ep * s.cp) + p.expert / double(s.dp * s.cp);
  const double held = s.zero > 0 ? shard : whole;  // elements of each state this rank keeps
  double grads = held;
  // fully_shard keeps two send buffers through the step, grown to the largest unit: the
  // packed shard it gathers from, and the unsharded gradient it reduce-scatters.
  const double send_buffers = p.largest_unit * (n.param_bytes / double(s.dp * s.ep * s.cp) + n.grad_bytes);
  if (s.zero == 3) {
    // Two units gathered (the one running, the one prefetched) and one unsharded gradient
    // beside the one being reduced.
    mem.zero_buffers = p.largest_unit * (2 * n.param_bytes + n.grad_bytes) + send_buffers;
  } else if (s.zero > 0) {
    // Every unit stays gathered through the step; the unit reducing its gradients holds
    // them unsharded beside the send buffers. ZeRO-1 accumulates every unit's gradients
    // unsharded over the microbatches (one microbatch reduces at once, as ZeRO-2).
    mem.zero_buffers = whole * n.param_bytes + p.largest_unit * n.grad_bytes + send_buffers;
    if (s.zero == 1 && s.microbatches > 1) grads += whole;
  } else if (n.ddp_buckets && s.data_replicas() > 1) {
    // The experts' gradients have a bucket only where they have replicas (dp or cp).
    mem.ddp_buckets = (p.dense + (s.dp * s.cp > 1 ? p.expert : 0.0)) * n.grad_bytes;
  }
  mem.params = held * n.param_bytes;
  mem.grads = grads * n.grad_bytes;
  mem.optimizer = held * n.optimizer_bytes;

  // Tokens of one microbatch on this rank, before the sequence-parallel split over tp.
  const double tokens = double(s.micro_batch) * m.seq_len / s.cp;
  const double t = s.tp;
  double per_mb = 0;
  if (n.eager) {
    // Eager ops keep everything unless the layer is recomputed: all of it (its input
    // kept), or its cheap ops.
    if (recomputes_whole_layers(s.recompute)) {
      per_mb = st.layers() * m.hidden / t;
    } else if (s.recompute == Recompute::Selective) {
      if (st.dense_layers) per_mb += st.dense_layers * eager_selective_layer_activation_elements(m, s.tp);
      // With ep > 1 a MoE layer also keeps its token exchanges' outputs (k rows of h per
      // token each way), which an unchecked layer frees: the region sees the exchanges
      // (collectives, kept) but not the dispatcher's own ops that read them.
      const double exchanges = s.ep > 1 ? 2.0 * double(m.top_k) * m.hidden : 0.0;
      if (st.moe_layers)
        per_mb += st.moe_layers * (eager_selective_layer_activation_elements(m, s.tp, true) + exchanges);
    } else {
      if (st.dense_layers) per_mb += st.dense_layers * eager_layer_activation_elements(m, s.tp);
      if (st.moe_layers) per_mb += st.moe_layers * eager_layer_activation_elements(m, s.tp, true);
    }
    per_mb *= n.activation_bytes * tokens;
  } else {
    if (st.dense_layers) per_mb += st.dense_layers * layer_activation_bytes_per_token(m, false, s.recompute);
    if (st.moe_layers) per_mb += st.moe_layers * layer_activation_bytes_per_token(m, true, s.recompute);
    per_mb *= tokens / t;
  }
  mem.activations = inflight * per_mb;
  // What a layer's backward brings back beside the saved activations (the whole layer under
  // full recompute, what selective dropped, the products' gradients), after the head's
  // backward has freed the logits: at the backward's start the part in `after_logits`
  // counts only where it exceeds them.
  double rematerialized = 0, after_logits = 0;
  // bf16 logits kept for the loss's backward plus their fp32 copy, one microbatch; eager
  // fp32: the final norm's tensors, the logits and their log-softmax.
  if (st.head && n.eager)
    mem.logits = tokens * (2 * m.hidden / t + 1 / t + m.hidden + 2 * double(m.vocab) / t) * n.activation_bytes;
  else if (st.head)
    mem.logits = tokens * double(m.vocab) / t * (2 + 4);
  if (recomputes_whole_layers(s.recompute) && st.layers() > 0 && n.eager) {
    // The backward of one layer has all of it back, and at a dense layer's peak the
    // gradient of SwiGLU's output beside it (SwiGLU then writes its own gradients over gate
    // and up); the fuller kind of layer counts. That comes after the head's backward, whose
    // logits are gone by then: the larger of the two counts.
    // full_chunked: the attention half, one token chunk of the MLP's SwiGLU, and the MLP
    // input's gradient, assembled chunk by chunk.
    double layer = 0;
    if (st.dense_layers) {
      const double swiglu = 3 * m.ffn / t + m.ffn / t, chunks = mlp_chunks(m, s);
      layer = eager_layer_activation_elements(m, s.tp) - 3 * m.ffn / t + swiglu / chunks;
      if (chunks > 1) layer += m.hidden / t;
    }
    if (st.moe_layers) layer = std::max(layer, eager_layer_activation_elements(m, s.tp, true));
    after_logits += tokens * layer * n.activation_bytes;
  } else if (s.recompute == Recompute::Selective && st.layers() > 0 && n.eager) {
    // The backward of one layer rematerializes what it dropped (a dense layer drops more):
    // what an unchecked layer keeps less what selective keeps.
    const bool moe = st.dense_layers == 0;
    const double dropped = tokens * n.activation_bytes * (eager_layer_activation_elements(m, s.tp, moe) -
                                                          eager_selective_layer_activation_elements(m, s.tp, moe));
    rematerialized += dropped;
  } else if (recomputes_whole_layers(s.recompute) && st.layers() > 0) {
    // The backward of one layer rematerializes all of it (full_chunked: the MLP's 6 ffn
    // bytes a token one chunk at a time).
    double layer = layer_activation_bytes_per_token(m, st.moe_layers > 0, Recompute::None);
    if (st.moe_layers == 0) layer -= 6.0 * m.ffn * (1 - 1 / mlp_chunks(m, s));
    rematerialized += tokens / t * layer;
  }
  if (n.eager && st.layers() > 0 && !recomputes_whole_layers(s.recompute)) {
    // A layer's backward holds beside every saved activation the gradient of SwiGLU's
    // output (per routed copy of a token in MoE layers), while the down projection's node
    // still holds SwiGLU's output; SwiGLU then writes its own gradients over gate and up.
    // On the stage with the head this peak and the head's (its logits term) come at
    // different times: the larger counts.
    double working = 0;
    if (st.dense_layers) working = m.ffn / t;
    if (st.moe_layers) working = std::max(working, double(m.top_k + m.shared_experts) * m.moe_ffn / t);
    after_logits += tokens * working * n.activation_bytes;
  }
  mem.activations += rematerialized + std::max(0.0, after_logits - mem.logits);
  if (s.pp > 1) {
    // A stage's input of every microbatch of the step is received into a buffer posted at
    // the step's start (or, once consumed, held as the input gradient sent back until the
    // step ends): those not alive as a running forward's input count too. Every chunk is
    // received but the first stage's.
    const double received = double(s.virtual_stages) - (index == 0 ? 1 : 0);
    const double buffers = std::max(0.0, received * double(s.microbatches) - inflight * double(s.virtual_stages));
    // A stage that sends keeps each in-flight microbatch's output (its send, its backward)
    // and the buffer posted at its forward for the output's gradient.
    const double sent = st.head ? 0 : 2 * inflight;
    mem.stage_inputs = (buffers + sent) * tokens * m.hidden / t * n.activation_bytes;
  }
  if (s.microbatches > 1) {
    mem.grads_at_activation_peak = mem.grads;
    mem.activations_at_gradient_peak = mem.with_activations();
  } else {
    // The backward starts after the head's, whose weight's gradient is the first to exist,
    // and ends in the first layer, holding its saved activations and what it rematerializes.
    const double head = st.head ? double(m.vocab) * m.hidden / t : 0.0;
    mem.grads_at_activation_peak = mem.grads * head / (p.dense + p.expert);
    const double first_layer = st.layers() > 0 ? inflight * per_mb / double(st.layers()) : 0.0;
    mem.activations_at_gradient_peak = first_layer + rematerialized + after_logits + mem.stage_inputs;
  }
  return mem;
}

}  // namespace hp::plan
