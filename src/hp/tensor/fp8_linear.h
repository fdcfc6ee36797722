// y = x W^T from FP8-quantized operands, on DTensors: linear's sharding record (Partial
// inputs are settled first: the amax of a partial term means nothing) and a local kernel
// that fake-quantizes each operand of each product and multiplies in float32, which is
// what an FP8 GEMM with float32 accumulation computes; on CUDA devices with FP8 GEMMs the
// products go through at::_scaled_mm where it takes the scaling (fp8_matmul.h).
//
// Each product quantizes its two operands along its own reduction dim (torchao's float8
// recipe):
//   forward  y  = deq(q(x))  . deq(q(W))^T      E4M3, both along in-features
//   backward dX = deq(q(dY)) . deq(q(W))        dY E5M2, W E4M3, both along out-features
//            dW = deq(q(dY))^T . deq(q(x))      dY E5M2, x E4M3, both along tokens
// Tensorwise scales do not depend on the dim, so backward reuses the forward's q(x),
// q(W) and one q(dY) for both products. The master weight stays float32.
//
// Under fully_shard with enable_fsdp_float8_all_gather, the weight arrives cast already:
// its unit gathers q(W) in E4M3 with W's whole-tensor scale and fills the weight's storage
// with deq(q(W)), which the product takes as its quantized operand as is (tensorwise only:
// one scale serves y and dX; rowwise and mx_block would need W quantized along both dims).
//
// Scales are those of the whole (logical) tensor whatever its layout, so every layout
// gives the single-process result. A shard's local amax is reduced (max) over the mesh
// dims that split the elements sharing a scale, through hp::comm:
//   Tensorwise: every mesh dim sharding the operand (tp shards of W and of dY under column
//               parallelism, of x and W under row parallelism; dp shards of x and dY).
//   Rowwise:    the mesh dims sharding the reduction dim: in-features of x and W under row
//               parallelism, out-features of dY and W (for dX) under column parallelism,
//               tokens of x and dY (for dW) under data parallelism.
//   MxBlock:    the mesh dims of rowwise, reducing one amax per global block of 32, so a
//               block that straddles shards gets the scale one process would give it.
#pragma once

#include <c10/core/Storage.h>

#include <memory>

#include "hp/tensor/amax_history.h"
#include "hp/tensor/dtensor.h"
#include "hp/tensor/fp8_quantize.h"

namespace hp {

struct Fp8LinearOptions {
  Fp8Scaling scaling = Fp8Scaling::Tensorwise;
  bool delayed = false;  // tensorwise only: scales from an amax history (amax_history.h)
  int history_len = 16;
  // fully_shard gathers the weight as E4M3 with its scale (half the bytes of bf16);
  // tensorwise only (torchao's enable_fsdp_float8_all_gather).
  bool enable_fsdp_float8_all_gather = false;
};

// The storage fully_shard's FP8 all-gather fills with deq(q(W)) at W's whole-tensor
// `scale`. The product takes a weight over it as q(W) at that scale: quantizing it again
// with a scale recomputed from dequantized values could move an element by one FP8 step.
struct Fp8PrecastWeight {
  c10::Storage storage;
  at::Tensor scale;  // float32 [], set by each forward's gather
};

// A callable x, W -> x W^T, holding one layer's amax histories when scaling is delayed
// (copies share them). float32 or bfloat16 inputs (fully_shard's mixed precision), quantized
// from float32 values; the output has the input's dtype.
class Fp8Linear {
 public:
  explicit Fp8Linear(Fp8LinearOptions options = Fp8LinearOptions());
  DTensor operator()(const DTensor& x, const DTensor& weight) const;
  const Fp8LinearOptions& options() const { return options_; }

  // The amax histories (null unless delayed), shared with the backward of every call.
  struct Histories {
    std::shared_ptr<AmaxHistory> input, weight, grad_output;
  };
  const Histories& histories() const { return histories_; }
  // Where fully_shard says the cast weight lies (copies share it).
  Fp8PrecastWeight& precast_weight() const { return *precast_; }

 private:
  Fp8LinearOptions options_;
  Histories histories_;
  std::shared_ptr<Fp8PrecastWeight> precast_ = std::make_shared<Fp8PrecastWeight>();
};

}  // namespace hp
