// Splits a model's layers into pipeline chunks (virtual stages) of balanced cost, so the
// slowest chunk, which paces the whole pipeline, is as fast as the layers allow.
#pragma once

#include <cstdint>
#include <vector>

#include "hp/plan/model_desc.h"

namespace hp::plan {

// Layers [first, first + count) of the model form one chunk (a pipeline stage).
struct StageSplit {
  std::vector<int64_t> layers;  // layers per chunk, in chunk order; sums to the layer count; a chunk may hold 0
  std::vector<double> costs;    // per chunk: its layers' costs plus its extra (first/last)
  double max_cost() const;      // the slowest chunk
  std::vector<int64_t> first_layer() const;  // prefix sums of layers
};

// Splits consecutive layers with costs `layer_costs` into `chunks` contiguous chunks
// minimising the slowest chunk's cost, where chunk 0 also pays `first_extra`
// (embedding) and the last chunk `last_extra` (norm, head, loss).
//
// Exact, by dynamic programming over suffixes (chunk j holding layers [i, e)), in two
// passes: the first finds the smallest slowest-chunk cost; the second breaks its ties.
// Tie rule: among the splits with that slowest chunk, the one with the smallest sum
// of squared chunk costs (the spare time spread evenly); among those (within a
// relative 1e-12), earlier chunks take more layers. Uniform costs thus give the even
// split with the remainder on the early chunks. Chunk costs are compared through
// prefix sums, so "smallest" holds up to their rounding.
// About layers^2 + chunks * layers steps when layers cost about the same (each scan
// stops after the layers one chunk can hold), chunks * layers^2 at most.
//
// Throws hp::Error naming the value when chunks < 1 or a cost or extra is negative
// or not finite.
StageSplit balance_stages(const std::vector<double>& layer_costs, int64_t chunks, double first_extra = 0,
                          double last_extra = 0);

// Per-layer forward FLOPs per token of `m` (a MoE layer costs its router and its
// top_k and shared experts), with the embedding as the first extra (a lookup: 0) and
// the output projection as the last: the estimator's FLOP model (flops.h).
struct LayerCosts {
  std::vector<double> layers;
  double first_extra = 0, last_extra = 0;
};
LayerCosts layer_costs(const ModelDesc& m);

// balance_stages on layer_costs(m).
StageSplit balance_stages(const ModelDesc& m, int64_t chunks);

}  // namespace hp::plan
