// The local kernels behind ContextParallel, one file per mode. Each takes this rank's
// piece of q [B, Hq, L, D] and k, v [B, Hkv, L, D] (rotary applied, L = this rank's share
// of the sequence) and returns its piece of the attended values [B, Hq, L, D],
// differentiably.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "hp/comm/group.h"
#include "hp/parallel/context_parallel_layout.h"

namespace hp::cp {

struct AttentionArgs {
  at::Tensor q, k, v;
  const comm::Group* group = nullptr;          // the cp dim's group
  std::vector<std::vector<SequenceRun>> runs;  // per cp rank: the positions it holds
  std::vector<int64_t> lengths;                // per cp rank: its tokens
  bool causal = true;
  double scale = 1.0;
};

at::Tensor ulysses_attention(const AttentionArgs& a);
at::Tensor allgather_kv_attention(const AttentionArgs& a);
at::Tensor ring_attention(const AttentionArgs& a);
// `a`: group = the ring's (outer) group; runs and lengths per rank of both dims, the ring
// dim major. Ulysses over `inner`, then the ring over the outer group.
at::Tensor hybrid_attention(const AttentionArgs& a, const comm::Group& inner);
// The K/V heads made to split evenly over `cp` ranks, each query head's own K/V head
// landing with it: repeated the fewest times that does it (1: as they are).
int64_t kv_head_repeats(int64_t q_heads, int64_t kv_heads, int64_t cp);

// Ring attention's work on this thread since the last reset (forward and backward): what the
// load-balance bench compares across ranks. CPU time of the calling thread, so that ranks
// sharing cores are not charged for each other.
struct RingAttentionStats {
  double compute_seconds = 0;
  int64_t score_elements = 0;  // query-key pairs scored
};
RingAttentionStats& ring_attention_stats();  // thread-local

// The global positions of `runs`, in order, as an int64 tensor.
at::Tensor positions_of(const std::vector<SequenceRun>& runs);
// Every rank's positions, rank 0's first: the order of a gathered sequence.
at::Tensor positions_of_all(const std::vector<std::vector<SequenceRun>>& runs);

}  // namespace hp::cp
