// All-reduce over the symmetric heap. Paths (the table is in collectives.h):
//   one shot  up to 256 KiB (or one step): every rank copies its tensor into its window
//             and folds the whole of it from every window; one barrier.
//   in heap   every rank's tensor, or its staged copy, in the heap: each rank folds its
//             slice reading its peers' tensors in place, then copies their folded slices;
//             two barriers (one more to learn that all are in the heap).
//   windows   otherwise: a chunk per step, each rank stages the slices its peers fold,
//             folds its own, and copies the previous chunk's folded slices back; one
//             barrier per step.
// A large private tensor is staged in the heap (one copy) where the staging choice says
// so (staging_choice.h) and there is room; it then takes the in-heap path.
#include <ATen/ATen.h>

#include <cstring>
#include <optional>

#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/fold.h"
#include "hp/comm/symm/peers.h"
#include "hp/comm/symm/staging_choice.h"
#include "hp/comm/symm/stream_copy.h"

namespace hp::symm {
namespace {

// Below this, every rank folds the whole message (one barrier) instead of its slice
// followed by an all-gather (two barriers): latency matters more than bytes.
constexpr size_t kOneShotBytes = 256 << 10;

// From this many steps, a private tensor may be staged: three barriers instead of one per
// step, and long streamed copies instead of small ones that stay in cache.
constexpr size_t kStagedSteps = 4;

// The windows move this many steps between barriers: each rank folds only 1/n of a step,
// so with one step the barriers cost more than the smaller copies save.
constexpr size_t kFoldSteps = 4;

// Where rank r's slice of `total` elements starts: slices of 16 elements.
int64_t slice_start(int64_t total, int n, int r) { return part_start<int64_t>(total, n, r, 16); }

struct Reduction {
  char* data;
  int64_t total;
  at::ScalarType dtype;
  ReduceOp op;
  size_t elem;
};

void one_shot(Heap& h, const Reduction& c) {
  const int64_t chunk = static_cast<int64_t>(std::min(h.scratch_bytes(), kFoldSteps * h.step_bytes()) / 2 / c.elem);
  for (int64_t off = 0; off < c.total; off += chunk) {
    const int64_t len = std::min(chunk, c.total - off);
    char* in = c.data + off * c.elem;
    const int p = h.next_parity();
    std::memcpy(h.scratch(h.rank(), p), in, len * c.elem);
    h.barrier("all_reduce");
    fold(in, peer_windows(h, p, 0), len, c.dtype, c.op);
  }
}

// Every rank's tensor is readable in the heap at at[r]: the tensor itself, or a copy of the
// slices its peers fold (staged). Each rank folds its slice reading its own tensor and its
// peers' buffers in place, then copies their folded slices: one copy per byte crosses
// between ranks. Two barriers: slices folded, slices read (a rank may change its buffer
// only after every peer has read it).
void in_heap(Heap& h, const Reduction& c, const std::vector<char*>& at) {
  const int n = h.size(), me = h.rank();
  auto lo = [&](int r) { return slice_start(c.total, n, r) * static_cast<int64_t>(c.elem); };
  // The fold may not alias its inputs. It lands, a window at a time, where this rank's
  // peers read it, and is copied to the tensor while in cache: in the staging buffer's own
  // slice, which holds no input, or, for a tensor in the heap, in the window, copied back.
  const bool staged = at[me] != c.data;
  const int64_t piece = static_cast<int64_t>(h.step_bytes() / c.elem * c.elem);
  std::vector<const char*> srcs(n);
  for (int64_t a = lo(me); a < lo(me + 1); a += piece) {
    const int64_t len = std::min(piece, lo(me + 1) - a);
    for (int s = 0; s < n; ++s) srcs[s] = (s == me ? c.data : at[s]) + a;
    char* folded = staged ? at[me] + a : h.scratch(me, 0);
    fold(folded, srcs, len / static_cast<int64_t>(c.elem), c.dtype, c.op);
    std::memcpy(c.data + a, folded, len);
  }
  h.barrier("all_reduce");
  for (int i = 1; i < n; ++i) {
    const int r = visit(h, i);
    copy_large(c.data + lo(r), at[r] + lo(r), lo(r + 1) - lo(r));
  }
  h.barrier("all_reduce");
}

// Each step, every rank stages the slices of a chunk its peers fold (slice_start),
// passes a barrier, copies its peers' folded slices of the previous chunk back, and folds
// its own slice of this one (reading its own input in place) into the second half of its
// window: one barrier per step, and one more before the last chunk's folded slices are
// copied back. `waited`: this rank passed a barrier after publishing (its tensor was in
// the heap, a peer's was not); the ranks that did not pass one more after their first
// step, so that its first chunk is staged before they read it.
void windows(Heap& h, const Reduction& c, int row, bool waited) {
  const int n = h.size(), me = h.rank();
  const size_t elem = c.elem;
  const size_t folded = std::min(h.scratch_bytes(), kFoldSteps * h.step_bytes()) / 2;  // input, then folded slices
  const int64_t chunk = static_cast<int64_t>(folded / elem);
  auto lo = [n](int64_t len, int r) { return slice_start(len, n, r); };
  auto collect = [&](int64_t off, int p) {
    const int64_t len = std::min(chunk, c.total - off);
    for (int r = 0; r < n; ++r)
      if (r != me)
        std::memcpy(c.data + (off + lo(len, r)) * elem, h.scratch(r, p) + folded + lo(len, r) * elem,
                    (lo(len, r + 1) - lo(len, r)) * elem);
  };
  // Read after the first barrier, when every rank's row is visible.
  auto peer_waited = [&] {
    for (int r = 0; r < n; ++r)
      if (input_in_heap(h, row, r)) return true;
    return false;
  };
  std::vector<const char*> srcs(n);
  int64_t off = 0;
  int p = 0;
  for (; off < c.total; off += chunk) {
    const int64_t len = std::min(chunk, c.total - off);
    char* in = c.data + off * elem;
    const int prev = p;
    p = h.next_parity();
    for (int r = 0; r < n; ++r)
      if (r != me)
        std::memcpy(h.scratch(me, p) + lo(len, r) * elem, in + lo(len, r) * elem, (lo(len, r + 1) - lo(len, r)) * elem);
    h.barrier("all_reduce");
    if (off == 0 && !waited && peer_waited()) h.barrier("all_reduce");
    if (off > 0) collect(off - chunk, prev);
    for (int s = 0; s < n; ++s) srcs[s] = (s == me ? in : h.scratch(s, p)) + lo(len, me) * elem;
    char* mine = h.scratch(me, p) + folded + lo(len, me) * elem;
    fold(mine, srcs, lo(len, me + 1) - lo(len, me), c.dtype, c.op);
    std::memcpy(in + lo(len, me) * elem, mine, (lo(len, me + 1) - lo(len, me)) * elem);
  }
  h.barrier("all_reduce");
  collect(off - chunk, p);
}

}  // namespace

void all_reduce(Heap& h, at::Tensor t, ReduceOp op) {
  const int n = h.size();
  const Reduction c{static_cast<char*>(t.data_ptr()), t.numel(), t.scalar_type(), op,
                    static_cast<size_t>(t.element_size())};
  const size_t bytes = c.total * c.elem;
  h.announce(all_reduce_call(bytes, c.dtype, op));
  if (c.total == 0) return h.barrier("all_reduce");
  if (bytes <= std::min(kOneShotBytes, h.step_bytes())) return one_shot(h, c);

  const bool private_tensor = !h.holds(c.data, bytes);
  std::optional<StagingChoice> choice;
  if (bytes >= kStagedSteps * h.step_bytes()) choice.emplace(h, bytes);
  Staging stage(h, choice && choice->stage() && private_tensor ? bytes : 0);
  if (stage.data())  // the slices its peers fold
    for (int i = 1; i < n; ++i) {
      const int r = visit(h, i);
      const int64_t lo = slice_start(c.total, n, r), hi = slice_start(c.total, n, r + 1);
      copy_large(stage.data() + lo * c.elem, c.data + lo * c.elem, (hi - lo) * c.elem);
    }
  const int row = h.next_exchange();
  publish(h, row, stage.data() ? stage.data() : c.data, bytes);
  // Where this rank's buffer is in the heap, a barrier tells whether every rank's is. A
  // rank whose buffer is not goes straight to the windows: its first step's barrier is
  // the one its peers wait at here.
  const bool waited = input_in_heap(h, row, h.rank());
  if (waited) {
    h.barrier("all_reduce");
    if (const std::vector<char*> at = heap_buffers(h, row); !at.empty()) {
      in_heap(h, c, at);
      if (choice && private_tensor) choice->took(StagingChoice::kStaged);
      return;
    }
  }
  windows(h, c, row, waited);
  if (choice && private_tensor && !stage.data()) choice->took(StagingChoice::kWindows);
}

}  // namespace hp::symm
