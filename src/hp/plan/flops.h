// Forward FLOPs per token of a model and of its pieces: the one FLOP model that the
// step-time estimator and the pipeline stage split share. 2 FLOPs per multiply-add;
// the embedding is a lookup and costs none.
#pragma once

#include "hp/plan/model_desc.h"

namespace hp::plan {

// Causal attention: QK^T and AV over on average seq/2 keys.
double attention_flops_per_token(const ModelDesc& m);
// One transformer layer: its matmuls (a MoE layer: router plus top_k and shared experts)
// and its attention.
double layer_forward_flops_per_token(const ModelDesc& m, bool moe);
// What a full checkpoint's recompute runs of one layer: its forward less the products
// whose output only meets the residual add (memory/region_ops.h), the MLP's down
// projection or the shared experts' (routed experts run as LibTorch's grouped products,
// which the recompute does not see).
double recomputed_layer_flops_per_token(const ModelDesc& m, bool moe);
// The output projection (the final norm is not counted).
double head_forward_flops_per_token(const ModelDesc& m);
// The whole model: every layer and the head.
double forward_flops_per_token(const ModelDesc& m);

}  // namespace hp::plan
