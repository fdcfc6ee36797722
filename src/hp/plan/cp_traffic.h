// What context-parallel attention (hp/parallel/context_parallel.h) moves in each mode, per
// rank, layer and microbatch: one entry per kind of call, with the bytes one rank hands it
// (its input, as comm's collective log counts them). The estimator prices these calls;
// bench_context_parallel and tests/parallel/cp_test.cpp hold them against the bytes the
// executed attention hands its collectives. Torch-free.
//   ulysses       all-to-all of q, k, v and the output, and back in backward: 4·N·h/cp
//                 a rank per layer each way (GQA: K/V heads repeated only as cp needs)
//   ring          K/V passed point to point: cp - 1 hops forward, cp - 1 in backward and
//                 cp hops carrying dK/dV home: (3·cp - 2)/cp of the K/V
//   allgather_kv  K/V all-gathered forward and backward, dK/dV reduce-scattered
//   hybrid        Ulysses inside the inner group of `ulysses` ranks, then the ring over
//                 the outer cp / ulysses ranks on the heads the all-to-all left each rank
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/topology/cluster.h"

namespace hp::plan {

const std::vector<std::string>& cp_modes();  // ulysses, ring, allgather_kv, hybrid

struct CpAttentionShape {
  double tokens = 0;                // of the sequences a cp group shares: micro-batch x sequence length
  int64_t heads = 1, kv_heads = 1;  // per tp rank
  int64_t head_dim = 1;
  double element_bytes = 4;
  int64_t cp = 1;       // ranks sharing each sequence
  int64_t ulysses = 1;  // hybrid: the inner ranks of cp running Ulysses; the ring has cp / ulysses
};

struct CpCall {
  std::string what;
  Collective op;        // AllToAll, SendRecv, AllGather or ReduceScatter
  bool inner = false;   // over the Ulysses group of hybrid; else over cp (hybrid: the ring's ranks)
  double bytes = 0;     // one rank's input per call
  double forward = 0;   // calls per layer in forward
  double backward = 0;  // and in backward
  bool beside_attention = false;  // can run while attention computes (ring hops, K/V gathers)
};

// Throws naming an unknown mode or degrees the mode cannot split.
std::vector<CpCall> cp_attention_calls(const std::string& mode, const CpAttentionShape& shape);
// Bytes one rank hands the calls per layer, forward and backward.
double cp_bytes_per_rank(const std::vector<CpCall>& calls);
// How many times Ulysses over `ranks` repeats each K/V head: the fewest that make the K/V
// heads divisible by `ranks` while each copy still serves whole query groups.
int64_t cp_kv_head_repeats(int64_t heads, int64_t kv_heads, int64_t ranks);

}  // namespace hp::plan
