#include "hp/memory/selective_region.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp {

CheckpointPolicy save_matmuls_and_collectives(const CheckpointOp& op) {
  return op.is_matmul() || op.collective ? CheckpointPolicy::PREFER_SAVE : CheckpointPolicy::PREFER_RECOMPUTE;
}

namespace memory {
namespace {

thread_local SelectiveRegion* t_packing = nullptr;
thread_local std::weak_ptr<SelectiveRegion> t_last_region;  // the next region's previous_

struct RegionHooks : torch::autograd::SavedVariableHooks {
  explicit RegionHooks(std::shared_ptr<SelectiveRegion> r) : region(std::move(r)) {}
  ~RegionHooks() override {
    if (slot) region->drop(*slot);
  }
  void call_pack_hook(const at::Tensor& t) override { slot = region->pack(t); }
  at::Tensor call_unpack_hook() override { return region->unpack(*slot); }
  std::shared_ptr<SelectiveRegion> region;
  std::shared_ptr<SelectiveRegion::Slot> slot;
};

struct HooksEngine : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (!t_packing) return nullptr;
    return std::make_unique<RegionHooks>(t_packing->shared_from_this());
  }
};

torch::autograd::Engine& hooks_engine() {
  static HooksEngine engine;
  return engine;
}

// Which kept outputs a budget prefers: matmuls, then the rest.
int keep_rank(const CheckpointOp& op) { return op.is_matmul() ? 0 : 1; }

}  // namespace

void install_saved_tensor_hooks_engine() {
  static std::once_flag once;
  std::call_once(once, [] {
    using torch::autograd::Engine;
    HP_CHECK(&Engine::get_default_engine() == &Engine::get_base_engine())
        << "selective checkpointing needs LibTorch's C++ autograd engine, and another one (Python's?) is "
        << "installed; use full checkpointing (no policy, no budget)";
    torch::autograd::set_default_engine_stub(hooks_engine);
  });
}

SelectiveRegion::SelectiveRegion(Options options, std::function<void()> replay)
    : options_(std::move(options)), replay_(std::move(replay)) {
  static std::atomic<uint64_t> next_id{0};
  id_ = next_id++;
  if (!options_.policy) options_.policy = save_matmuls_and_collectives;
  if (options_.memory_budget) {
    HP_CHECK(*options_.memory_budget >= 0 && *options_.memory_budget <= 1)
        << "checkpoint: memory_budget is a fraction of the region's activations, from 0 to 1; got "
        << *options_.memory_budget;
  }
}

SelectiveRegion::~SelectiveRegion() {
  if (written_.valid()) written_.wait();  // a failed write is an error for readers only: none is left
  for (size_t k = 0; k < entries_.size(); ++k) {
    if (entries_[k].prefetched.valid()) entries_[k].prefetched.wait();  // before its file goes
    if (entries_[k].swapped && !held_) options_.swap_tier->remove(swap_key(k));
  }
}

std::string SelectiveRegion::swap_key(size_t k) const {
  return "activation." + std::to_string(id_) + "." + std::to_string(k);
}

void SelectiveRegion::protect(const at::Tensor& t) {
  by_storage_.insert(t, -1);
}

SelectiveRegion::Recording::Recording(SelectiveRegion* r) : r_(r) {
  HP_CHECK(t_packing == nullptr) << "checkpoint: a selective region inside another one on the same thread";
  // The region before, if it held what it dropped (release_at_next_region), lets go now,
  // unless its backward has begun: then it replays nothing.
  if (auto previous = t_last_region.lock(); previous && previous->held_ && !previous->unpacked_) previous->release();
  r_->previous_ = t_last_region;
  t_last_region = r_->weak_from_this();
  r_->rng_ = get_rng_state();
  t_packing = r_;
  observer_ = std::make_unique<ScopedOpObserver>(r_);
}

SelectiveRegion::Recording::~Recording() {
  if (finished_) return;
  observer_.reset();
  t_packing = nullptr;
}

void SelectiveRegion::Recording::finish() {
  observer_.reset();
  t_packing = nullptr;
  finished_ = true;
  r_->mode_ = Mode::Done;
  r_->decide();
}

at::Tensor SelectiveRegion::run(const ObservedOp& op, const std::function<at::Tensor()>& compute) {
  if (mode_ == Mode::Forward) {
    at::Tensor out = compute();
    Entry e;
    e.op.name = op.name();
    e.op.kind = op.op ? std::optional<OpKind>(op.op->kind) : std::nullopt;
    e.op.collective = op.communicates();
    if (op.inputs)
      for (const at::Tensor& t : *op.inputs) {
        const int* producer = by_storage_.find(t);
        if (!producer)
          untracked_input_ = untracked_input_ || storage_of(t) != nullptr;
        else if (*producer >= 0)
          e.inputs.push_back(*producer);
      }
    if (out.defined()) {
      e.sizes = out.sizes().vec();
      e.strides = out.strides().vec();
      e.options = out.options();
      e.offset = out.storage_offset();
    }
    e.owns_storage = by_storage_.insert(out, static_cast<int>(entries_.size()));
    if (e.owns_storage) {
      e.op.bytes = static_cast<int64_t>(out.storage().nbytes());
      e.value = out.detach();
    }
    e.policy = options_.policy(e.op);
    for (int i : e.inputs) ++entries_[i].readers;
    if (e.op.collective && (e.policy == CheckpointPolicy::MUST_SAVE || e.policy == CheckpointPolicy::PREFER_SAVE ||
                            e.policy == CheckpointPolicy::MUST_SWAP))
      for (int i : e.inputs) release_before_collective(entries_[i]);
    entries_.push_back(std::move(e));
    return out;
  }
  HP_CHECK(mode_ == Mode::Replay) << "checkpoint: an op observed outside the region's forward and replay";
  const size_t k = cursor_++;
  const std::string name = op.name();
  HP_CHECK(k < entries_.size() && entries_[k].op.name == name)
      << "checkpoint: the recompute ran " << name << " as op " << k << " where the forward ran "
      << (k < entries_.size() ? entries_[k].op.name : std::string("nothing"))
      << " (the region must run the same ops each time)";
  Entry& e = entries_[k];
  if (e.keep && e.swapped) return bring_back(k);
  if (e.keep) return e.value;
  // A view costs nothing and reads its owner, which stands for it in the bookkeeping
  // (inputs are traced by storage): it always runs.
  if (!e.demanded && e.owns_storage) return at::empty_strided(e.sizes, e.strides, e.options).zero_();
  at::Tensor out = compute();
  if (e.owns_storage) e.replayed = out = in_forward_layout(e, out);
  return out;
}

void SelectiveRegion::release_before_collective(Entry& in) {
  if (!in.owns_storage || in.referenced || in.readers != 1 || in.op.collective ||
      (in.policy != CheckpointPolicy::PREFER_SAVE && in.policy != CheckpointPolicy::PREFER_RECOMPUTE))
    return;
  in.released_early = true;
  in.value = at::Tensor();  // by_storage_ keeps its storage object: no new output takes its address
}

// The saved views index into the forward's storage of an output: a recompute that lays it
// out otherwise (another path of the same op, such as a redistribution that gives a view
// of a larger buffer with gradients on and a compact tensor without) is copied into that
// layout.
at::Tensor SelectiveRegion::in_forward_layout(const Entry& e, const at::Tensor& out) {
  HP_CHECK(out.sizes().vec() == e.sizes) << "checkpoint: the recompute of " << e.op.name << " gave shape "
                                         << out.sizes() << " where the forward's was " << to_string_list(e.sizes);
  if (static_cast<int64_t>(out.storage().nbytes()) == e.op.bytes && out.strides().vec() == e.strides &&
      out.storage_offset() == e.offset)
    return out;
  const int64_t n = e.op.bytes / static_cast<int64_t>(e.options.dtype().itemsize());
  return at::empty({n}, e.options).as_strided(e.sizes, e.strides, e.offset).copy_(out);
}

void SelectiveRegion::decide() {
  int64_t referenced = 0, must = 0, collectives = 0;
  std::vector<size_t> prefer;
  for (size_t k = 0; k < entries_.size(); ++k) {
    Entry& e = entries_[k];
    if (!e.owns_storage) continue;
    HP_CHECK(e.policy != CheckpointPolicy::MUST_SWAP || options_.swap_tier)
        << "checkpoint: the policy asks MUST_SWAP for " << e.op.name << ", and CheckpointOptions::swap_tier is unset";
    if (e.referenced) referenced += e.op.bytes;
    if (e.policy == CheckpointPolicy::MUST_SWAP) e.keep = e.swapped = true;  // kept, but not in memory
    if (e.policy == CheckpointPolicy::MUST_SAVE) e.keep = true, must += e.op.bytes;
    if (e.policy == CheckpointPolicy::PREFER_SAVE || e.policy == CheckpointPolicy::PREFER_RECOMPUTE) {
      // A budget chooses by this rank's sizes, and every rank of a collective must choose
      // alike (a MoE token exchange receives other row counts on each): collectives go as
      // the policy prefers, and what they keep counts against the budget first.
      if (!options_.memory_budget || e.op.collective) {
        e.keep = e.policy == CheckpointPolicy::PREFER_SAVE && !e.released_early;
        if (e.keep && e.op.collective) collectives += e.op.bytes;
      } else if (!e.released_early) {
        prefer.push_back(k);
      }
    }
  }
  if (options_.memory_budget) {
    const double own = *options_.memory_budget * static_cast<double>(referenced);
    HP_CHECK(static_cast<double>(must) <= own)
        << "checkpoint: memory budget " << *options_.memory_budget << " of the region's " << referenced
        << " bytes of activations allows " << static_cast<int64_t>(own) << " bytes, but its MUST_SAVE ops alone keep "
        << must << " bytes";
    // What the region before it left of its budget, while that one waits for its backward:
    // such regions together keep their budget's share of their activations (identical
    // layers would otherwise each stop short of it by the same op).
    const std::shared_ptr<SelectiveRegion> previous = previous_.lock();
    const double allowed = own + (previous && !previous->replayed_ ? previous->budget_left_ : 0.0);
    std::stable_sort(prefer.begin(), prefer.end(), [&](size_t a, size_t b) {
      const Entry &x = entries_[a], &y = entries_[b];
      if (keep_rank(x.op) != keep_rank(y.op)) return keep_rank(x.op) < keep_rank(y.op);
      return x.op.bytes < y.op.bytes;
    });
    // An output nothing reads however the rest is chosen is never kept: it takes no share.
    // Nor is one that only kept outputs read once the others are chosen (nothing recomputes
    // its readers): its share goes back to those after it, until no choice frees more.
    std::vector<bool> open = read(/*through_kept=*/true);
    double used = static_cast<double>(must + collectives);
    for (bool freed = true; freed;) {
      // The rest, cheap to recompute, only keep what lies beyond the largest product left
      // out: that share passes on, and the next region may keep its product with it.
      double reserve = 0;
      for (size_t k : prefer) {
        Entry& e = entries_[k];
        const double bytes = static_cast<double>(e.op.bytes);
        if (keep_rank(e.op) == 0 && open[k] && !e.keep) {
          if (used + bytes <= allowed)
            e.keep = true, used += bytes;
          else
            reserve = std::max(reserve, bytes);
        }
        if (keep_rank(e.op) == 1 && open[k] && !e.keep && used + bytes + reserve <= allowed) e.keep = true, used += bytes;
      }
      const std::vector<bool> demanded = read(/*through_kept=*/false);
      freed = false;
      for (size_t k : prefer)
        if (entries_[k].keep && !demanded[k]) {
          entries_[k].keep = open[k] = false;
          used -= static_cast<double>(entries_[k].op.bytes);
          freed = true;
        }
    }
    budget_left_ = std::max(0.0, allowed - used);
    // With a swap tier, the products it leaves out that the backward needs go there
    // instead of being recomputed; the rest is recomputed from them.
    if (options_.swap_tier) {
      const std::vector<bool> demanded = read(/*through_kept=*/false);
      for (size_t k : prefer) {
        Entry& e = entries_[k];
        if (keep_rank(e.op) == 0 && !e.keep && demanded[k]) e.keep = e.swapped = true;
      }
    }
  }
  keep_readers_instead();
  mark_demanded();
  swap_in_alone_ = options_.swap_tier != nullptr;
  int64_t swapped = 0, largest = 0;
  for (Entry& e : entries_) {
    e.swapped = e.swapped && e.keep;
    if (!e.keep) e.value = at::Tensor();  // autograd's saved tensors in it stay until release
    if (e.owns_storage && e.demanded && !e.keep) swap_in_alone_ = false;
    if (e.swapped) swapped += e.op.bytes, largest = std::max(largest, e.op.bytes);
  }
  // Alone, by default one output is read while autograd works on the one before; a replay
  // needs them all.
  swap_window_ = !swap_in_alone_ ? swapped : options_.swap_read_ahead > 0 ? options_.swap_read_ahead : 2 * largest;
  unscheduled_ = entries_.size();
  held_ = true;
  if (!options_.release_at_next_region) release();
}

void SelectiveRegion::wait_written() const {
  if (written_.valid()) written_.get();  // rethrows a failed write's error
}

void wait_for_swap_writes() {
  for (auto r = t_last_region.lock(); r; r = r->previous_.lock()) r->wait_written();
}

void SelectiveRegion::release() {
  // One region's writes at a time: the one before must have finished its own (or its
  // error comes out here, in the forward).
  if (auto previous = previous_.lock()) previous->wait_written();
  held_ = false;
  std::vector<std::pair<std::string, at::Tensor>> writes;
  for (size_t k = 0; k < entries_.size(); ++k) {
    Entry& e = entries_[k];
    if (!e.swapped) continue;
    const int64_t n = e.op.bytes / static_cast<int64_t>(e.value.itemsize());
    writes.emplace_back(swap_key(k), e.value.new_empty({0}).set_(e.value.storage(), 0, {n}, {1}));
    e.value = at::Tensor();
  }
  // Host tensors are written by a thread of their own while the next region runs its
  // forward, each let go once written; a device tensor's write returns once its copy is
  // queued on the tier's stream (HostTier), so it is written here.
  std::shared_ptr<StorageTier> tier = options_.swap_tier;
  auto write_all = [tier](std::vector<std::pair<std::string, at::Tensor>>& writes) {
    for (auto& [key, t] : writes) tier->write(key, t), t = at::Tensor();
  };
  const bool on_host = std::all_of(writes.begin(), writes.end(), [](const auto& w) { return w.second.is_cpu(); });
  if (!on_host)
    write_all(writes);
  else if (!writes.empty())
    written_ = std::async(std::launch::async, [write_all, writes = std::move(writes)]() mutable {
                 write_all(writes);
               }).share();
  for (auto& slot : slots_)
    if (slot->entry >= 0 && (!entries_[slot->entry].keep || entries_[slot->entry].swapped)) slot->value = at::Tensor();
  slots_.clear();  // from here on autograd holds them, and drops each once its node has run
}

void SelectiveRegion::keep_readers_instead() {
  auto movable = [](const Entry& e) {
    return e.owns_storage && !e.op.collective && !e.swapped && !e.released_early &&
           (e.policy == CheckpointPolicy::PREFER_SAVE || e.policy == CheckpointPolicy::PREFER_RECOMPUTE);
  };
  const std::vector<bool> demanded = read(/*through_kept=*/false);
  for (size_t m = 0; m < entries_.size(); ++m) {
    Entry& kept = entries_[m];
    if (!kept.keep || kept.referenced || !movable(kept) || untracked_input_) continue;
    std::vector<size_t> readers;
    int64_t bytes = 0;
    bool only_readers = true;
    for (size_t r = m + 1; r < entries_.size() && only_readers; ++r) {
      const Entry& e = entries_[r];
      if (e.keep || !demanded[r] || !e.owns_storage ||
          std::find(e.inputs.begin(), e.inputs.end(), static_cast<int>(m)) == e.inputs.end())
        continue;
      only_readers = movable(e) && e.policy != CheckpointPolicy::MUST_RECOMPUTE &&
                     std::all_of(e.inputs.begin(), e.inputs.end(), [&](int i) { return i == static_cast<int>(m); });
      readers.push_back(r);
      bytes += e.op.bytes;
    }
    if (!only_readers || readers.empty() || bytes > kept.op.bytes) continue;
    kept.keep = false;
    for (size_t r : readers) entries_[r].keep = true;
  }
}

std::vector<bool> SelectiveRegion::read(bool through_kept) const {
  // An op's output (or the storage it views) is read by autograd, or by an op whose output
  // is read and recomputed; walking back from the last op.
  std::vector<bool> out(entries_.size(), false);
  for (size_t i = entries_.size(); i-- > 0;) {
    const Entry& e = entries_[i];
    out[i] = out[i] || untracked_input_ || e.referenced;
    if (!out[i] || (e.keep && !through_kept)) continue;
    for (int j : e.inputs) out[j] = true;
  }
  return out;
}

void SelectiveRegion::mark_demanded() {
  // A kept output ends the chain: what only it read is not recomputed.
  const std::vector<bool> demanded = read(/*through_kept=*/false);
  for (size_t i = 0; i < entries_.size(); ++i) {
    entries_[i].demanded = demanded[i];
    if (!demanded[i]) entries_[i].keep = false;  // nothing reads it: neither kept nor recomputed
  }
}

// Before the replay every kept output stays: the replay may read one outside the ops it
// traces (a MoE dispatcher reads the routing's indices).
void SelectiveRegion::release_if_unused(Entry& e) {
  if (e.live_slots > 0 || !replay_over()) return;
  e.value = at::Tensor();
  e.replayed = at::Tensor();
}

void SelectiveRegion::drop(Slot& slot) {
  slot.value = at::Tensor();  // a held region's list has it too
  if (slot.entry < 0) return;
  Entry& e = entries_[slot.entry];
  --e.live_slots;
  release_if_unused(e);
}

std::shared_ptr<SelectiveRegion::Slot> SelectiveRegion::pack(const at::Tensor& t) {
  auto slot = std::make_shared<Slot>();
  slot->value = t.detach();
  if (const int* producer = by_storage_.find(t); producer && *producer >= 0) {
    slot->entry = *producer;
    entries_[*producer].referenced = true;
    ++entries_[*producer].live_slots;
    slot->sizes = t.sizes().vec();
    slot->strides = t.strides().vec();
    slot->offset = t.storage_offset();
  }
  slots_.push_back(slot);
  return slot;
}

at::Tensor SelectiveRegion::unpack(Slot& slot) {
  unpacked_ = true;
  if (slot.entry < 0) return slot.value;
  Entry& e = entries_[slot.entry];
  if (!slot.value.defined() && !swap_in_alone_) replay_once();
  if (!slot.value.defined() && swap_in_alone_ && !e.replayed.defined()) {
    prefetch_ahead();
    bring_back(slot.entry);
    prefetch_ahead();
  }
  at::Tensor t = slot.value;
  if (!t.defined()) {
    HP_CHECK(e.replayed.defined() && static_cast<int64_t>(e.replayed.storage().nbytes()) == e.op.bytes)
        << "checkpoint: the recompute of " << e.op.name << " did not give an output like the forward's ("
        << e.op.bytes << " bytes)";
    t = e.replayed.as_strided(slot.sizes, slot.strides, slot.offset);
  }
  // The last saved tensor in an output takes its storage over once the replay has read it,
  // where the backward keeps no graph (nothing unpacks it again): a kernel may then write
  // over it (swiglu's gradients), as over a tensor autograd saved without hooks.
  if (replay_over() && e.live_slots == 1 && !torch::autograd::get_current_graph_task_keep_graph()) {
    slot.value = at::Tensor();
    e.value = at::Tensor();
    e.replayed = at::Tensor();
  }
  return t;
}

at::Tensor SelectiveRegion::bring_back(size_t k) {
  Entry& e = entries_[k];
  at::Tensor flat;
  if (e.prefetched.valid()) {
    const std::shared_future<at::Tensor> read = std::move(e.prefetched);
    e.prefetched = {};  // it would hold the storage until the region goes
    ahead_bytes_ -= e.op.bytes;
    flat = read.get();
  } else {
    wait_written();
    flat = at::empty({e.op.bytes / static_cast<int64_t>(e.options.dtype().itemsize())}, e.options);
    options_.swap_tier->read(swap_key(k), flat);
  }
  e.back = true;
  e.replayed = flat.as_strided(e.sizes, e.strides, e.offset);  // the whole storage: saved views index into it
  return e.replayed;
}

void SelectiveRegion::prefetch_ahead() {
  int64_t ahead = 0;
  for (auto r = shared_from_this(); r; r = r->previous_.lock()) {
    ahead += r->ahead_bytes_;
    if (r->mode_ != Mode::Done || r->held_) continue;  // a held region has it all in memory
    for (; r->unscheduled_ > 0; --r->unscheduled_) {
      const size_t k = r->unscheduled_ - 1;
      Entry& e = r->entries_[k];
      if (!e.swapped || e.back || e.prefetched.valid()) continue;
      if (ahead > 0 && ahead + e.op.bytes > r->swap_window_) return;
      std::shared_ptr<StorageTier> tier = r->options_.swap_tier;
      const std::string key = r->swap_key(k);
      const int64_t n = e.op.bytes / static_cast<int64_t>(e.options.dtype().itemsize());
      const at::TensorOptions opts = e.options;
      e.prefetched = std::async(std::launch::async, [tier, key, n, opts, written = r->written_] {
                       if (written.valid()) written.get();
                       at::Tensor flat = at::empty({n}, opts);
                       tier->read(key, flat);
                       return flat;
                     }).share();
      ahead += e.op.bytes;
      r->ahead_bytes_ += e.op.bytes;
    }
  }
}

void SelectiveRegion::replay_once() {
  if (replayed_) return;
  prefetch_ahead();  // what the replay reads that is not on its way yet
  HP_CHECK(mode_ == Mode::Done) << "checkpoint: a saved tensor unpacked before the region's forward ended";
  const RngState outer = get_rng_state();
  mode_ = Mode::Replay;
  cursor_ = 0;
  try {
    ScopedOpObserver observer(this);
    at::NoGradGuard no_grad;
    if (options_.replay_rng) set_rng_state(rng_);
    RecomputeTimer timer;
    replay_();
  } catch (...) {
    set_rng_state(outer);
    mode_ = Mode::Done;
    throw;
  }
  set_rng_state(outer);
  mode_ = Mode::Done;
  HP_CHECK(cursor_ == entries_.size()) << "checkpoint: the recompute ran " << cursor_ << " ops where the forward ran "
                                       << entries_.size() << " (the region must run the same ops each time)";
  replayed_ = true;
  for (Entry& e : entries_) release_if_unused(e);  // what only the replay read
  prefetch_ahead();  // the layer before runs its backward next
}

int64_t SelectiveRegion::kept_bytes() const {
  int64_t n = 0;
  for (const Entry& e : entries_)
    if (e.owns_storage && e.keep) n += e.op.bytes;
  return n;
}

int64_t SelectiveRegion::released_bytes() const {
  int64_t n = 0;
  for (const Entry& e : entries_)
    if (e.owns_storage && !e.keep) n += e.op.bytes;
  return n;
}

}  // namespace memory
}  // namespace hp
