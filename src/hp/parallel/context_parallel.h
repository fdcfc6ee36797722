// Context parallelism: the sequence dim of activations is sharded over a cp mesh dim, and
// only attention, where every query meets keys from the whole sequence, communicates.
// The ContextParallel style replaces an attention module's core from outside the model:
//
//   parallelize_module(model, mesh["cp"], {{"layers.*.attn", ContextParallel({CpMode::ring})}});
//   DTensor ids = shard_sequence(tokens, mesh, {Shard(0), Replicate()}, "cp");
//
// The sequence is held in the order of context_parallel_layout.h (load-balanced by default)
// and sharded evenly, uneven lengths included (torch.chunk sizes: rank r holds piece r).
// Rotary and the causal mask use each token's global position; parameters stay replicated
// over cp and their gradients are summed over it, as for any split work on a replicated
// tensor; the loss averages over all tokens of the global sequence.
#pragma once

#include <string>
#include <vector>

#include "hp/nn/transformer.h"
#include "hp/parallel/context_parallel_layout.h"
#include "hp/parallel/tensor_parallel.h"

namespace hp {

enum class CpMode {
  ulysses,       // all-to-all sequence-sharded -> head-sharded, whole-sequence attention, and back
  ring,          // K/V blocks passed around the ring; partial results merged by log-sum-exp
  allgather_kv,  // K/V all-gathered, local queries only
  hybrid,        // Ulysses over an inner mesh dim (inside a host), ring over the outer one
};
const char* to_string(CpMode mode);
CpMode cp_mode_from_string(const std::string& name);  // "ulysses", "ring", "allgather_kv", "hybrid"

struct ContextParallelOptions {
  CpMode mode = CpMode::ring;
  bool load_balance = true;  // head-tail layout; shard_sequence must be given the same
  // hybrid: the mesh dim of the Ulysses all-to-all (inside a host); the style's own mesh
  // dim runs the ring. The sequence is sharded over both, the ring dim outer (first).
  std::string ulysses_dim;
};

// The style for an nn::Attention module (the mesh passed to parallelize_module is the cp
// dim). Its input must be sharded on the sequence dim over cp.
Style ContextParallel(ContextParallelOptions options = {});

// The context-parallel attention core on its own: q [B, Hq, S, Dh] and k, v [B, Hkv, S, Dh]
// before rotary, sequence (dim 2) sharded over mesh dim `cp_dim` and held in the order of
// `options.load_balance`; heads or batch may be sharded over other dims.
DTensor context_parallel_attention(const nn::AttentionCoreInputs& in, int cp_dim,
                                   const ContextParallelOptions& options);

// Lays out `full` [B, S, ...] (token ids, labels) for context parallelism: its sequence dim
// reordered as `load_balance` says, then sharded over mesh dim `cp_dim` (Shard(1)), other
// mesh dims taking `placements` (whose entry for cp_dim is ignored).
DTensor shard_sequence(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                       const std::string& cp_dim, bool load_balance = true);
// Over several mesh dims (hybrid: the ring dim, then the Ulysses dim), in mesh order.
DTensor shard_sequence(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                       const std::vector<std::string>& cp_dims, bool load_balance = true);
// The inverse: the whole [B, S, ...] tensor in the natural order, on every rank.
at::Tensor unshard_sequence(const DTensor& x, bool load_balance = true);

}  // namespace hp
