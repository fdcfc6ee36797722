// The non-reentrant checkpointed region behind selective policies and memory budgets.
//
// Forward runs with gradients on and records, through the thread's OpObserver, every DTensor
// op and redistribution in order, keeping each output until the region ends. Meanwhile
// saved-tensor hooks see every tensor autograd saves: one whose storage an op of the
// region created is tied to that op; others (the region's input, parameters, a kernel's
// internal temporaries) are kept as autograd would. When the forward ends, the policy
// (and budget) decides per op: kept outputs stay, the rest are released, with every saved
// tensor that points into them (with release_at_next_region only once the next region on the
// thread starts its forward: a region whose backward begins first keeps them and never
// replays).
//
// The first backward that unpacks a released tensor replays the region once, without
// gradients, with the RNG and the parameters as the forward saw them: an op whose output
// was kept returns it without running (a matmul is not recomputed, a collective is not
// issued again), an op that neither autograd nor a recomputed op reads returns zeros of
// its shape, the others run. Kept outputs that nothing in the replay reads and autograd did
// not save are released too. MUST_SWAP outputs are kept in the swap tier instead of memory:
// written while the next region runs its forward (host tensors by a thread, each let go once
// written; a failed write is an error at the next region's release or at the backward).
// Where nothing needs recomputing (every op swapped or kept: a swap_wrapper's region) there
// is no replay: each output comes back alone when autograd first unpacks it, the next one in
// the backward's order (this region's later ops, then the region before's) being read
// meanwhile, so a backward holds its working set and two outputs more, not its region's
// whole. A replay reads all the region's swapped outputs at once, and the region before's
// start coming back once it has run. The saved tensor comes back as the same view of the
// output. The graph is the forward's, so gradients are bitwise those of a run without
// checkpointing. Once the region has replayed (or, with no replay, its backward has begun),
// an output is released when autograd has dropped every saved tensor in it, as autograd
// frees a saved tensor once its node has run; the last one unpacked takes it over.
//
// LibTorch's default saved-tensor hooks are a Python stack; a C++ program gets them by
// installing an autograd engine whose get_default_saved_variable_hooks returns ours while
// a region's forward runs on the thread (install_saved_tensor_hooks_engine).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "hp/memory/checkpoint_policy.h"
#include "hp/memory/storage_map.h"
#include "hp/memory/storage_tier.h"
#include "hp/tensor/op_observer.h"
#include "hp/tensor/random.h"
#include "hp/tensor/recompute_scope.h"

namespace hp::memory {

// Once per process; an error where another engine (Python's) is installed already.
void install_saved_tensor_hooks_engine();

// Adds its lifetime to recompute_seconds(); recomputing() holds meanwhile.
class RecomputeTimer {
 public:
  RecomputeTimer() : start_(std::chrono::steady_clock::now()) {}
  ~RecomputeTimer();
  RecomputeTimer(const RecomputeTimer&) = delete;
  RecomputeTimer& operator=(const RecomputeTimer&) = delete;

 private:
  std::chrono::steady_clock::time_point start_;
  RecomputeScope scope_;
};

class SelectiveRegion : public OpObserver, public std::enable_shared_from_this<SelectiveRegion> {
 public:
  struct Options {
    CheckpointPolicyFn policy;
    std::optional<double> memory_budget;
    bool replay_rng = true;
    std::shared_ptr<StorageTier> swap_tier;
    bool release_at_next_region = false;  // CheckpointOptions::release_at_next_region
    int64_t swap_read_ahead = 0;          // CheckpointOptions::swap_read_ahead
  };
  // `replay` runs the region again (without gradients) as its forward did.
  SelectiveRegion(Options options, std::function<void()> replay);
  ~SelectiveRegion() override;

  // Tensors whose storage belongs to no op of the region (its input, the parameters).
  void protect(const at::Tensor& t);
  // Runs the forward with the region recording; then decides and releases.
  template <typename F>
  auto forward(F&& f) {
    Recording rec(this);
    auto out = f();
    rec.finish();
    return out;
  }

  // The saved-tensor hooks' two halves.
  struct Slot {
    int entry = -1;        // the op whose output holds it; -1: kept as is
    at::Tensor value;      // undefined once released
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
  };
  std::shared_ptr<Slot> pack(const at::Tensor& t);
  at::Tensor unpack(Slot& slot);
  // Autograd let go of the slot (its node ran): once the region has replayed, an output no
  // slot holds any longer is released, as autograd frees a saved tensor once its node ran.
  void drop(Slot& slot);

  at::Tensor run(const ObservedOp& op, const std::function<at::Tensor()>& compute) override;

  // After the forward: bytes of op outputs kept, and of those released.
  int64_t kept_bytes() const;
  int64_t released_bytes() const;

 private:
  struct Entry {
    CheckpointOp op;
    CheckpointPolicy policy = CheckpointPolicy::PREFER_RECOMPUTE;
    bool owns_storage = false;  // its output is new storage (not a view of another)
    bool referenced = false;    // autograd saved a tensor in it
    bool keep = false;
    bool swapped = false;       // kept in the swap tier, not in memory
    std::shared_future<at::Tensor> prefetched;  // its storage, being read back
    bool back = false;          // swapped, and brought back for the backward (not to be read again)
    bool demanded = false;      // the replay must produce it (for autograd, or for an op that must)
    int live_slots = 0;         // saved tensors of autograd's that point into it, not yet dropped
    int readers = 0;            // ops of the region that read it so far
    bool released_early = false;  // let go in the forward: never kept, recomputed where demanded
    std::vector<int> inputs;    // entries whose outputs it reads
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;
    at::TensorOptions options;
    at::Tensor value;           // forward output (kept ones: until the region goes)
    at::Tensor replayed;
  };
  // `out`, a recompute of e, in the layout of e's output in the forward (a copy if it differs).
  static at::Tensor in_forward_layout(const Entry& e, const at::Tensor& out);
  class Recording {
   public:
    explicit Recording(SelectiveRegion* r);
    ~Recording();
    void finish();

   private:
    SelectiveRegion* r_;
    std::unique_ptr<ScopedOpObserver> observer_;
    bool finished_ = false;
  };
  void decide();
  // Lets go of what the region dropped (and writes what it swaps): when its forward ends, or
  // with release_at_next_region when the next region on the thread starts, unless its
  // backward has begun by then.
  void release();
  // No replay will read a kept output any more: it has run, or never will.
  bool replay_over() const { return replayed_ || (unpacked_ && (held_ || swap_in_alone_)); }
  // Per entry, whether autograd or a recomputed op reads its output. A kept output is not
  // recomputed, so its inputs are not read for it, unless `through_kept`: then the answer
  // holds however the rest is chosen.
  std::vector<bool> read(bool through_kept) const;
  // A kept output autograd does not read, kept only to recompute ops that read nothing else
  // (rotary from a projection, the residual add from the last one), gives way to those ops'
  // outputs where they take no more bytes: the same memory, less to recompute.
  void keep_readers_instead();
  void mark_demanded();
  // A kept collective that is the only reader so far of an output autograd has not saved (a
  // row-parallel product's partial sums, a sharded norm's output) makes it unkeepable, and
  // the forward lets it go as soon as the model does, as it would without checkpointing.
  void release_before_collective(Entry& in);
  void release_if_unused(Entry& e);
  std::string swap_key(size_t k) const;
  void replay_once();

  Options options_;
  std::function<void()> replay_;
  RngState rng_;
  enum class Mode { Forward, Done, Replay } mode_ = Mode::Forward;
  std::vector<Entry> entries_;
  size_t cursor_ = 0;
  StorageMap<int> by_storage_;  // an output's storage -> its entry; -1: protected
  std::vector<std::shared_ptr<Slot>> slots_;
  bool replayed_ = false;
  bool held_ = false;      // decided, and what it dropped not yet released
  bool unpacked_ = false;  // its backward has begun
  bool untracked_input_ = false;  // an op read a tensor of unknown origin: replay every op
  uint64_t id_;  // names its entries in the swap tier
  // The region made before this one on the thread (the layer before, in forward order): its
  // swapped outputs are read back while this one's backward runs.
  std::weak_ptr<SelectiveRegion> previous_;
  double budget_left_ = 0;  // bytes of its memory budget (and those handed on to it) it did not keep
  // Everything its backward reads is kept, in memory or in the swap tier (a swap_wrapper's
  // region): nothing replays, and each swapped output comes back alone when autograd first
  // unpacks it, instead of the whole region at once.
  bool swap_in_alone_ = false;
  // Swapped output k's storage in the forward's layout, from its prefetch or read now.
  at::Tensor bring_back(size_t k);
  // Starts reading swapped outputs back in the backward's order (this region's last ops
  // first, then the regions before it), while those read and not yet brought back stay
  // within swap_window_ bytes.
  void prefetch_ahead();
  size_t unscheduled_ = 0;     // swapped outputs not yet brought back nor being read are all below it
  int64_t swap_window_ = 0;    // alone: swap_read_ahead, or two of its largest outputs; a replay: all
  int64_t ahead_bytes_ = 0;    // of its outputs being read, or read and not yet brought back
  std::shared_future<void> written_;  // its swapped outputs' writes, when a thread makes them
  void wait_written() const;
  friend void wait_for_swap_writes();
};

}  // namespace hp::memory
