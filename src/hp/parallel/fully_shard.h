// fully_shard: parameters, gradients and optimizer states sharded over data-parallel
// ranks. A 1-D mesh gives FSDP; a 2-D (replicate, shard) mesh gives HSDP.
//
// Each call makes `module` a unit owning the parameters under it that no inner unit owns
// (call it on the blocks first, then on the root). Between steps every parameter is an
// ordinary DTensor sharded over the shard mesh dim, so the optimizer, gradient clipping
// and checkpoints need nothing special; create the optimizer after fully_shard.
// Around a unit's forward, one fused all-gather (a flat buffer of all its parameters)
// rebuilds them; after its backward, one fused reduce-scatter (then an all-reduce over the
// replicate dim) leaves gradient shards. The next unit's all-gather is in flight while the
// current one computes, in forward and in backward.
//
// The parameters must live on a mesh that has the dims of `mesh` (by name), replicated
// there: build the model on the whole (dp, tp) mesh, apply tensor parallelism on
// mesh["tp"], then fully_shard on mesh["dp"]. The shard dim may flatten several of the
// parameters' dims: fully_shard(m, mesh[{"dp", "ep"}].flatten("dp_ep")) shards over all
// their ranks in one group (fsdp_mesh_dims.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>

#include "hp/comm/device_mesh.h"
#include "hp/memory/offloaded_parameters.h"
#include "hp/nn/module.h"
#include "hp/parallel/fsdp_offload.h"

namespace hp {

struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;   // gathered parameters and compute (e.g. kBFloat16)
  std::optional<at::ScalarType> reduce_dtype;  // gradients are reduced in this dtype (e.g. kFloat)
};

struct FullyShardOptions {
  bool reshard_after_forward = true;  // free gathered parameters after forward, gather again for backward
  // Off: gathered parameters outlive backward too, so the next microbatch of the step reuses
  // them (ZeRO-1/2); turn it on again before the step's last backward, since the optimizer
  // updates the shards and a gather left standing would be stale.
  bool reshard_after_backward = true;
  bool prefetch = true;               // gather the next unit while this one computes
  MixedPrecisionPolicy mp_policy;
  OffloadPolicyVariant offload_policy;  // sharded parameters and gradients off memory (fsdp_offload.h)
};

namespace parallel {
class FSDPUnit;
}

// A handle on a unit and the units inside it.
class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<parallel::FSDPUnit> unit) : unit_(std::move(unit)) {}
  // Off: backward accumulates unsharded gradients locally and communicates nothing (the
  // micro-steps of gradient accumulation); the next backward with it on reduces them all.
  void set_requires_gradient_sync(bool on);
  void set_reshard_after_forward(bool on);
  void set_reshard_after_backward(bool on);
  void set_prefetch(bool on);
  // Bytes of gathered (unsharded) parameters this unit and those inside it hold now.
  int64_t unsharded_bytes() const;

  // With an offload policy: brings every offloaded shard and gradient of this unit and those
  // inside it into memory, to read or change (clipping, a checkpoint, an optimizer other
  // than memory::SwapOptimizer); each goes out again at its unit's next all-gather.
  void bring_in_offloaded();
  // The offloaded parameters of this unit and those inside it, for
  // memory::SwapOptimizerOptions::parameters (the optimizer then streams them by batch).
  std::shared_ptr<memory::OffloadedParameters> offloaded_parameters() const;

 private:
  friend std::shared_ptr<memory::OffloadedParameters> offloaded_parameters(const std::vector<FSDPModule>& roots);
  std::shared_ptr<parallel::FSDPUnit> unit_;
};

// The offloaded parameters of several roots as one (a pipeline rank's chunks).
std::shared_ptr<memory::OffloadedParameters> offloaded_parameters(const std::vector<FSDPModule>& roots);

FSDPModule fully_shard(nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options = {});

}  // namespace hp
