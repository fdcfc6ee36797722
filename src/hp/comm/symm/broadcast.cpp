// Broadcast over the symmetric heap. Paths (the table is in collectives.h):
//   in heap   from 256 KiB, every rank's tensor in the heap: every rank, the root too,
//             copies its share of the root's tensor into every receiver's; two barriers.
//   split     from 256 KiB, the root's tensor readable by every receiver (in the heap, or
//             by cross-memory reads): receivers read all but their share, which the root
//             writes; two barriers.
//   windows   otherwise: a window of the root's tensor per step; one barrier per step.
#include <ATen/ATen.h>

#include <cstring>

#include "hp/base/error.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/peers.h"
#include "hp/comm/symm/stream_copy.h"

namespace hp::symm {
namespace {

// Where rank k's 1/n share of a broadcast of `bytes` starts, in lines of 64 bytes.
size_t share_start(size_t bytes, int n, int k) { return part_start<size_t>(bytes, n, k, 64); }

// Tensors in the heap on every rank: every rank, the root included, copies its 1/n share
// of the root's tensor into every receiver's, so the copying is spread over all of them.
void broadcast_in_heap(Heap& h, const std::vector<char*>& bufs, size_t bytes, int root) {
  const int n = h.size(), me = h.rank();
  const size_t lo = share_start(bytes, n, me), len = share_start(bytes, n, me + 1) - lo;
  for (int i = 0; i < n; ++i) {
    const int r = visit(h, i);
    if (r != root && len) copy_large(bufs[r] + lo, bufs[root] + lo, len);
  }
}

// Otherwise, where every receiver can read the root's tensor (in the heap, or by a
// cross-memory read): each receiver r copies all but share r from the root, and the root,
// idle otherwise, writes share r into r meanwhile where it can reach r's tensor. Each byte
// moves once, and at 2 ranks the root and the receiver copy half each: 1.35-1.6x faster
// than the windows at 4-64 MiB, cross-memory both ways.
void broadcast_split(Heap& h, int row, char* d, size_t bytes, int root) {
  const int n = h.size(), me = h.rank();
  auto root_writes = [&](int r) { return input_in_heap(h, row, r) || h.single_copy(); };
  auto lo = [&](int k) { return share_start(bytes, n, k); };
  if (me == root) {
    for (int i = 1; i < n; ++i) {
      const int r = visit(h, i);
      const size_t len = lo(r + 1) - lo(r);
      if (len && root_writes(r)) copy_to_peer(h, row, r, lo(r), d + lo(r), len, "broadcast");
    }
    return;
  }
  // What this rank reads: [0, bytes), but for its own share if the root writes it.
  const size_t skip_lo = root_writes(me) ? lo(me) : bytes, skip_hi = root_writes(me) ? lo(me + 1) : bytes;
  // The shares after this rank's first: receivers start apart.
  copy_from_peer(h, row, root, skip_hi, d + skip_hi, bytes - skip_hi, "broadcast");
  copy_from_peer(h, row, root, 0, d, skip_lo, "broadcast");
}

}  // namespace

void broadcast(Heap& h, void* data, size_t bytes, int root) {
  const int me = h.rank();
  HP_CHECK(root >= 0 && root < h.size()) << "broadcast on " << h.what() << ": root " << root
                                         << " is outside the group";
  char* d = static_cast<char*>(data);
  h.announce(broadcast_call(bytes, root));
  if (bytes == 0) return h.barrier("broadcast");
  if (may_read_in_place(h, bytes)) {
    const int row = h.next_exchange();
    publish(h, row, d, bytes);
    h.barrier("broadcast");
    const std::vector<char*> bufs = heap_buffers(h, row);
    if (!bufs.empty() || input_in_heap(h, row, root) || h.single_copy()) {
      if (!bufs.empty()) broadcast_in_heap(h, bufs, bytes, root);
      else broadcast_split(h, row, d, bytes, root);
      h.barrier("broadcast");  // every share written, and the root's read, before any rank goes on
      return;
    }
  }
  const size_t window = h.step_bytes();
  for (size_t off = 0; off < bytes; off += window) {
    const size_t len = std::min(window, bytes - off);
    const int p = h.next_parity();
    if (me == root) std::memcpy(h.scratch(root, p), d + off, len);
    h.barrier("broadcast");
    if (me != root) std::memcpy(d + off, h.scratch(root, p), len);
  }
}

}  // namespace hp::symm
