// FP8 linear layers chosen from outside the model, by name pattern, as tensor parallelism
// is: apply_low_precision sets each matching Linear's product (Linear::set_product) to an
// FP8 one (hp/tensor/fp8_linear.h), so the model's code holds no FP8 and the parameters
// stay the Linear's own float32 master weights, which the optimizer and checkpoints see
// as before. Apply it before or after parallelize_module: the FP8 product follows
// whatever layouts the styles give the weight and the input, reducing amaxes over the
// ranks that hold pieces of a scale group.
//
// With enable_fsdp_float8_all_gather, fully_shard gathers these weights in E4M3 with
// their scales (hp/parallel/fsdp_float8.h) instead of in float32 or bf16.
//
// CPU path: quantize, dequantize, multiply in float32, which equals an FP8 GEMM with
// float32 accumulation. A CUDA path through _scaled_mm is not part of this yet.
#pragma once

#include <string>
#include <vector>

#include "hp/nn/module.h"

namespace hp {

struct LowPrecisionConfig {
  // Weights and activations; gradients are always E5M2 (the recipe's choice of range).
  std::string format = "e4m3";
  std::string scaling = "tensorwise";  // tensorwise, rowwise or mx_block
  bool delayed = false;                // tensorwise only: scales from an amax history
  int history_len = 16;
  // fully_shard gathers the FP8 Linears' weights as E4M3 with their scales, about half the
  // bytes of bf16 (tensorwise only, as torchao; other parameters gather in their own dtype).
  bool enable_fsdp_float8_all_gather = false;
  // Name patterns as in a tensor-parallel plan ("layers.*.attn.q_proj", "*" one segment).
  std::vector<std::string> include_fqns;                // empty: every Linear
  std::vector<std::string> exclude_fqns = {"output"};   // the head stays float32
};

// Swaps the chosen Linears' products; returns their names. An include pattern that
// matches no Linear is an error (a typo would otherwise leave the layer in float32).
std::vector<std::string> apply_low_precision(nn::Module& model, const LowPrecisionConfig& config);

}  // namespace hp
