// Expert parallelism declared from outside the model, as parallel styles on MoE modules
// for parallelize_module:
//
//   parallelize_module(model, mesh["ep"], {{"layers.*.moe", ExpertParallel()}});
//   parallelize_module(model, mesh["tp"], {{"layers.*.moe", ExpertTensorParallel()}});
//
// The ep mesh dim must split the batch (each ep rank holds its own tokens, as a data-
// parallel dim does): the non-expert parameters stay replicated over it and their
// gradients are summed there, as over any data-parallel dim.
#pragma once

#include "hp/nn/moe.h"
#include "hp/parallel/tensor_parallel.h"

namespace hp {

// Experts sharded over the mesh dim (w1, w2, w3 Shard(0), in torch.chunk pieces: 6
// experts over 4 ranks give 2, 2, 2, 0) and an AllToAllTokenDispatcher on its group,
// keeping the MoE's capacity factor.
Style ExpertParallel();
// Experts' hidden dim sharded over the mesh dim (w1, w3 Shard(1), w2 Shard(2)); the MoE's
// input and output are made Replicate there and the experts' partial outputs summed.
Style ExpertTensorParallel();
// With sequence parallelism: the MoE takes its sequence-sharded input as its own tokens
// (rows split over every dim its input is split on) and routes only those, gathering
// nothing; its output keeps the input's layout. Its routed experts stay whole over tp
// (the sequence split makes tp a token dim for them: gradients summed there); the shared
// experts take Colwise/Rowwise with rows Shard(0) out, as a dense MLP under SP.
Style MoESequenceParallel();

}  // namespace hp
