// fully_shard's offload policies (PyTorch's names): where sharded parameters and their
// gradients live between uses.
//
// OffloadPolicy: nowhere else (the default). CPUOffloadPolicy: host memory (HostTier:
// pinned buffers and a copy stream for device tensors; on a CPU build a plain host copy).
// FileOffloadPolicy: files on local disk (FileTier), for the CPU build, where host memory
// is the memory being saved. PyTorch has no file policy; DeepSpeed calls it NVMe offload.
//
// Between uses a unit's shards and gradient shards are in the tier and their memory is
// released. The shard is read back just before the unit's all-gather (so the unit
// prefetch reads it one unit ahead) and released once packed; the reduce-scattered
// gradient shard is written and released. PyTorch steps the optimizer on the CPU copies;
// here the optimizer streams them: a memory::SwapOptimizer given the module's
// offloaded_parameters() brings each batch in, updates it and sends it out. Any other
// reader (another optimizer, clipping, a checkpoint) calls FSDPModule::bring_in_offloaded()
// first; what it brought in goes out again at its unit's next all-gather.
#pragma once

#include <memory>
#include <string>
#include <variant>

#include "hp/memory/storage_tier.h"

namespace hp {

struct OffloadPolicy {};  // nothing offloaded

struct CPUOffloadPolicy {
  bool pin_memory = true;  // page-locked host buffers for device tensors (asynchronous copies)
};

struct FileOffloadPolicy {
  std::string dir;  // files go in dir/rank<r>.unit<n>, removed with the module
};

using OffloadPolicyVariant = std::variant<OffloadPolicy, CPUOffloadPolicy, FileOffloadPolicy>;

namespace parallel {
// The tier a unit of `rank` keeps its shards in; null for OffloadPolicy.
std::shared_ptr<memory::StorageTier> make_offload_tier(const OffloadPolicyVariant& policy, int rank);
}  // namespace parallel

}  // namespace hp
