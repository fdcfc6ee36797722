// The bytes fully_shard's all-gathers move in one training step, from the collective log:
// FP8 Linears whose weights travel in FP8 (enable_fsdp_float8_all_gather, tensorwise)
// against bf16 parameters (mp_policy.param_dtype) on the same model. Counted, not timed:
// the same on any machine. Every rank of `mesh` (1-D, data parallel) must call it.
// bench_fsdp prints the ratio last, as RESULT fp8_all_gather_bytes_ratio.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "hp/parallel.h"

struct GatherBytes {
  int64_t fp8 = 0, bf16 = 0;  // this rank's all-gather input bytes over one step
  double ratio() const { return bf16 > 0 ? double(fp8) / double(bf16) : 0.0; }  // 0: one rank gathers nothing
};

inline GatherBytes fsdp_gather_bytes(const hp::nn::LlamaConfig& c, const hp::DeviceMesh& mesh, int64_t batch,
                                     int64_t seq) {
  using namespace hp;
  GatherBytes out;
  for (bool fp8 : {true, false}) {
    manual_seed(7);
    nn::Llama model(c, mesh);
    FullyShardOptions o;
    if (fp8) {
      LowPrecisionConfig lp;
      lp.enable_fsdp_float8_all_gather = true;
      apply_low_precision(model, lp);
    } else {
      o.mp_policy.param_dtype = at::kBFloat16;
    }
    fully_shard_llama(model, mesh, o);
    const at::Tensor tokens = (hp::rand({batch, seq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, seq).contiguous(), mesh, {Shard(0)});
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, seq).contiguous(), mesh, {Shard(0)});
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    model.loss(ids, targets).to_local().backward();
    log.enable(false);
    for (const auto& r : log.records())
      if (r.op == "all_gather") (fp8 ? out.fp8 : out.bf16) += r.bytes();
    log.clear();
  }
  return out;
}
