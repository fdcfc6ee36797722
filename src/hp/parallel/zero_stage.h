// ZeRO's stages on fully_shard, for steps of several microbatches (gradient
// accumulation or pipeline microbatches). Every stage shards optimizer states
// over the data ranks:
//   1: parameters gathered at the step's first forward and kept to its last
//   backward;
//      gradients accumulated unsharded and reduce-scattered once, in the last
//      backward;
//   2: parameters as 1; gradients reduce-scattered after every backward into
//   shards; 3: fully_shard's default: parameters gathered for every forward and
//   every backward.
// Stage 1 moves the bytes of one all-reduce per step (as DDP), stage 2 adds a
// reduce-scatter per microbatch, stage 3 two all-gathers more; memory falls the
// other way.
#pragma once

#include "hp/parallel/fully_shard.h"

namespace hp {

// fully_shard's options for `stage` (1, 2 or 3) on top of `base`; throws for
// other values.
FullyShardOptions zero_stage_options(int stage, FullyShardOptions base = {});

// Call before each backward of a step, with whether it is the step's last.
void prepare_zero_backward(FSDPModule &unit, int stage, bool last);

} // namespace hp
