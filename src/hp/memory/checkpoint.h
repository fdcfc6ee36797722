// Activation checkpointing: a region runs its forward without keeping what its backward
// needs (only its input), and its backward runs the forward again, with gradients on,
// first. Memory falls from every activation inside the region to its input; time grows by
// one forward of the region.
//
// The region is a custom autograd node whose inputs are the region's input and the
// parameters it reads, so their gradients flow on through the ordinary graph: into
// AccumulateGrad for plain parameters, into fully_shard's reduce-scatter node for
// gathered ones, into the previous region's node. The recompute replays hp's
// counter-based RNG from the state the forward started at, so dropout draws the same mask.
// Everything inside the region runs again, collectives of tensor-parallel layers included
// (every rank recomputes the same regions in the same order, so they pair up), except
// products whose output value nothing reads (a block's last projection, which meets only
// the residual add): those give their backward node alone (memory/region_ops.h).
// A parameter whose gradient exists already (a second micro-batch, gradients zeroed in
// place) lends it to the recompute, which adds into it weight by weight, as the run without
// checkpointing does; its AccumulateGrad still runs after the region's node, with its
// hooks (DistributedDataParallel's).
//
// LibTorch's C++ API has no torch.utils.checkpoint, so full checkpointing here is the
// reentrant form: tensors the region reads must be its input or a listed parameter, and a
// region that reaches any other tensor needing a gradient is an error at backward, naming
// the node, instead of a silently missing gradient.
//
// Selective checkpointing (a policy, or a memory budget) is the non-reentrant form
// (selective_region.h): the forward records its graph, the tensors it saves for backward
// are dropped or kept per op, and the first backward that needs a dropped one replays the
// region without gradients, handing back the kept outputs (no matmul or collective runs
// again when the policy kept it).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hp/memory/checkpoint_policy.h"
#include "hp/memory/storage_tier.h"
#include "hp/nn/module.h"
#include "hp/tensor/dtensor.h"

namespace hp {

struct CheckpointOptions {
  CheckpointOptions() {}  // not an aggregate: checkpoint_wrapper(root, {"layers.*"}) must pick the patterns
  // Replay hp's RNG (random.h) in the recompute, so dropout-like draws repeat exactly.
  bool preserve_rng_state = true;
  // Selective checkpointing: decides per op of the region whether its output is kept or
  // recomputed (save_matmuls_and_collectives, or the user's). Unset, and no budget: the
  // whole region is recomputed.
  CheckpointPolicyFn policy;
  // Memory-budget mode: keep at most this fraction (0 to 1) of the region's activation bytes
  // (the op outputs its backward reads), plus what the region before it on the thread left
  // of its own while that one waits for its backward (so a forward's regions together keep
  // this fraction of their activations), choosing what to keep among the PREFER_ ops:
  // matmuls, then the rest (cheap to recompute: only with what lies beyond the largest
  // matmul output left out), smallest first within each, after the collectives, which go as
  // the policy prefers (every rank must choose alike, and sizes may differ between ranks);
  // an output that only kept outputs read takes no share. MUST_SAVE ops that alone exceed
  // the budget are an error. Without a policy, the default one's. With a swap_tier, the
  // matmul outputs it leaves out that the backward reads go to the tier instead of being
  // recomputed (the rest is recomputed from them).
  std::optional<double> memory_budget;
  // Where MUST_SWAP outputs go between forward and backward (e.g. a memory::FileTier), and
  // the matmul outputs a memory budget does not keep in memory.
  std::shared_ptr<memory::StorageTier> swap_tier;
  // Where a region has nothing to recompute (swap_wrapper's), each swapped activation comes
  // back when autograd first needs it, and the next ones in the backward's order (into the
  // region before) are read meanwhile, up to this many bytes ahead; 0: two of the region's
  // largest activations, one read while autograd works on the other (enough where reading
  // an activation takes less than the backward ops between two of them: files in the page
  // cache on a CPU). More hides more of a slow tier's reads, for as much memory more; a
  // region's bytes is the classic one-layer-ahead prefetch. A region that replays reads all
  // of its swapped outputs at once, and the region before's once it has replayed.
  int64_t swap_read_ahead = 0;
  // Selective: what a region drops goes when the next region on the thread starts its
  // forward, not when its own ends. The region whose backward comes before another region
  // starts (the last block; each microbatch's on a pipeline's last stage) then keeps all it
  // made and replays nothing: its recompute would lower no peak, since its backward has it
  // all back at once. The cost: that region's dropped bytes stay beside what runs before its
  // backward (the head's logits), which matters where those outweigh a layer's activations.
  bool release_at_next_region = false;
  // Full checkpointing of a region that treats its rows alone (an MLP): its backward
  // recomputes and differentiates its rows (ranges of a sequence's tokens: every dimension
  // but the last) in about this many chunks, one after another, so only one chunk's
  // activations are alive at a time. The parameters' gradients become the chunks' sums
  // (equal to float32 rounding). The forward follows the rows through the region's hp ops
  // (memory/token_chunk_check.h): where one combines tokens of a sequence (attention, a
  // sequence-parallel reduce-scatter) the chunks are whole sequences; one that combines
  // sequences (a sum over the batch, a MoE token exchange), a region whose output hp's ops
  // did not make from its input (a MoE layer's dispatch on local tensors), one that draws
  // random numbers, or one that holds a fully_shard unit is an error. A region on plain
  // tensors (checkpoint(at::Tensor fn, ...)) is trusted to treat its rows alone.
  int token_chunks = 1;
};

// In hp::memory because hp::checkpoint is the namespace of distributed checkpoints.
namespace memory {

// fn(input) as a checkpointed region. `params` are the slots fn reads its trainable
// tensors from (e.g. module.parameters()); the recompute puts fresh leaves in them for
// its duration.
DTensor checkpoint(const std::function<DTensor(const DTensor&)>& fn, const DTensor& input,
                   const std::vector<DTensor*>& params, const CheckpointOptions& options = {});
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const std::vector<at::Tensor*>& params, const CheckpointOptions& options = {});

// module(input) with module.forward as the region: the module's own hooks (fully_shard's
// gather and reshard, a tensor-parallel style's input and output layouts) run once,
// outside it; the hooks of the modules inside run again in the recompute.
DTensor checkpoint(nn::Module& module, const DTensor& input, const CheckpointOptions& options = {});

// Wall seconds this process has spent recomputing checkpointed regions (full and
// selective) since it started: the part of a step that checkpointing adds.
double recompute_seconds();
// Products full regions' recomputes have left out since the process started: hp::linear ops
// whose output value nothing read, run for their backward node alone (region_ops.h).
int64_t products_left_out();
// Swapped activations are written by a thread while the next region runs its forward, and a
// backward waits for them by itself. This waits until those of every region this thread
// has run reached their tier, rethrowing a failed write's error (a full disk) before the
// backward would: for measuring memory after a forward, or failing early.
void wait_for_swap_writes();

}  // namespace memory

// Makes every call of `module` checkpointed (from outside the model, as parallelism is).
// Apply before or after parallelize_module and fully_shard: the wrapper sits between a
// module's hooks and its forward either way.
void checkpoint_wrapper(nn::Module& module, const CheckpointOptions& options = {});
// The modules under `root` whose names match one of `patterns` ("layers.*", as the
// tensor-parallel plan's). A pattern matching no module, or nested matches, are errors.
// Regions inside regions come from separate calls (checkpoint_wrapper(model, {"layers.*"})
// then checkpoint_wrapper(model, {"layers.*.mlp"}, chunked)): the outer region keeps its
// input only, and its backward runs the inner region's forward only in the inner backward
// where nothing else reads the inner output (nested_regions.h).
void checkpoint_wrapper(nn::Module& root, const std::vector<std::string>& patterns,
                        const CheckpointOptions& options = {});

// Swapping instead of recomputing: every activation the module's backward reads goes to
// `tier` after its forward (a memory::HostTier for device tensors, a memory::FileTier on
// disk) and comes back for its backward, each activation when autograd first needs it, the
// next one read meanwhile (into the module before, when this one's are all back): nothing is
// recomputed, and a backward holds its working set and two activations more. The options
// are those of checkpoint_wrapper with MUST_SWAP for every op (swap_options), so a policy can
// mix swapping with saving and recomputing.
CheckpointOptions swap_options(std::shared_ptr<memory::StorageTier> tier);
void swap_wrapper(nn::Module& module, std::shared_ptr<memory::StorageTier> tier);
void swap_wrapper(nn::Module& root, const std::vector<std::string>& patterns,
                  std::shared_ptr<memory::StorageTier> tier);

}  // namespace hp
