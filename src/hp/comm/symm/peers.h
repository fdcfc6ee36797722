// What the shared-memory collectives share: each call's exchange row in the control block
// (where every rank's buffers lie, published before a barrier and read after it), copies to
// and from peers, and the arithmetic of splitting work over ranks. Internal to
// collectives.h's implementation (all_reduce.cpp, reduce_scatter.cpp, ...).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hp/comm/symm/heap.h"

namespace hp::symm {

// From this size of a message (or one step, if smaller), a collective first asks whether
// every rank's buffer lies in the symmetric heap (one barrier more) and then reads its
// peers' buffers in place.
constexpr size_t kInPlaceBytes = 256 << 10;
inline bool may_read_in_place(const Heap& h, size_t bytes) { return bytes >= std::min(kInPlaceBytes, h.step_bytes()); }

// Publishes, in exchange row `row`, the buffer this rank's peers read: where it lies in
// its heap and its address for cross-memory reads and writes. An empty buffer counts as in
// the heap: there is nothing to read. `p` null: not to be reached in place.
void publish(Heap& h, int row, const void* p, size_t bytes);
// Publishes, in row `row`, where this rank's output lies in its heap (null or elsewhere:
// nowhere) and its size, so that peers can write into it.
void publish_output(Heap& h, int row, const void* p, size_t bytes);

// After the barrier that follows publishing: whether rank r's input (output) is in its
// heap, and where, as this rank maps it.
inline bool input_in_heap(const Heap& h, int row, int r) { return h.control(r).heap_at[row] != 0; }
inline bool output_in_heap(const Heap& h, int row, int r) { return h.control(r).out_at[row] != 0; }
inline char* peer_input(const Heap& h, int row, int r) { return h.user(r) + (h.control(r).heap_at[row] - 1); }
inline char* peer_output(const Heap& h, int row, int r) { return h.user(r) + (h.control(r).out_at[row] - 1); }

// Every rank's published buffer, as this rank maps it, or nothing if any rank's is not in
// its heap. All ranks reach the same answer.
std::vector<char*> heap_buffers(const Heap& h, int row);

// Copies `bytes` from offset `from` of rank r's published buffer into `dst`, or from `src`
// to offset `to` of it: a plain copy where it is in r's heap, else a cross-memory one.
void copy_from_peer(const Heap& h, int row, int r, uint64_t from, void* dst, size_t bytes, const char* op);
void copy_to_peer(const Heap& h, int row, int r, uint64_t to, const void* src, size_t bytes, const char* op);

// Who moves the piece from rank s to rank r when it moves once, straight from input to
// output: r reads it where s's input is in the heap, else s writes it where r's output
// is. Both sides reach the same answer from what was published.
inline bool receiver_reads(const Heap& h, int row, int s, int r) {
  return input_in_heap(h, row, s) || !output_in_heap(h, row, r);
}

// Whether every non-empty piece (moves(s, r)) has an input or an output in the heap.
template <typename Moves>
bool every_piece_reachable(const Heap& h, int row, Moves moves) {
  for (int s = 0; s < h.size(); ++s)
    for (int r = 0; r < h.size(); ++r)
      if (s != r && moves(s, r) && !input_in_heap(h, row, s) && !output_in_heap(h, row, r)) return false;
  return true;
}

// The scratch windows of every rank for a step of `parity`, `byte_off` in.
std::vector<const char*> peer_windows(const Heap& h, int parity, size_t byte_off);

// Where part k starts when `total` units are split over n ranks in parts of a multiple of
// `align` (a power of two) units each, so that copies stay aligned; trailing parts short.
template <typename T>
T part_start(T total, int n, int k, T align) {
  const T per = ((total + n - 1) / n + align - 1) & ~(align - 1);
  return std::min<T>(total, k * per);
}

// The length of the window-sized piece at `off` of a `total`-byte buffer (0 past its end).
inline size_t clamp_len(size_t total, size_t off, size_t window) {
  return off >= total ? 0 : std::min(window, total - off);
}

// Peers in the order this rank visits them: itself first, then the next ranks round the
// ring, so that no rank's memory is read by all the others at once.
inline int visit(const Heap& h, int i) { return (h.rank() + i) % h.size(); }

// Room in this rank's local region of the heap for one call, given back when the call
// returns; none where the region is full.
class Staging {
 public:
  Staging(Heap& h, size_t bytes) : h_(h), ok_(bytes > 0 && h.try_allocate_local(bytes, &off_)) {}
  ~Staging() {
    if (ok_) h_.release(off_);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  // Null without room.
  char* data() const { return ok_ ? h_.user(h_.rank()) + off_ : nullptr; }

 private:
  Heap& h_;
  size_t off_ = 0;
  bool ok_;
};

}  // namespace hp::symm
