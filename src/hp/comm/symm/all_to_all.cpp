// All-to-all over the symmetric heap. Paths (the table is in collectives.h):
//   single copy  the largest piece from 64 KiB, where cross-memory copies work or every
//                piece has its input or its output in the heap: each piece moves once,
//                read by its receiver or written by its sender; two barriers.
//   windows      otherwise: a slot per peer in the windows per step; one barrier per step
//                (the sizes travel with the first step's data).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "hp/base/error.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/peers.h"
#include "hp/comm/symm/stream_copy.h"

namespace hp::symm {
namespace {

// From this size of the largest piece, all-to-all reads each piece once from its sender's
// buffer (a system call per peer and one more barrier) instead of twice through windows.
constexpr size_t kSingleCopyBytes = 64 << 10;

// Whether rank r leaves the first window of an all-to-all unstaged, from what it published
// before the first barrier: a piece of kSingleCopyBytes or more, which moves once where
// single copy works or where r's output is in the heap, as hp::comm's are (peers' outputs
// then likely are too).
bool skips_staging(const Heap& h, int row, int r) {
  size_t most = 0;
  for (int s = 0; s < h.size(); ++s)
    if (s != r) most = std::max<size_t>(most, h.control(r).sizes[row][s]);
  return most >= kSingleCopyBytes && (h.single_copy() || output_in_heap(h, row, r));
}

}  // namespace

void all_to_all(Heap& h, const void* in, const std::vector<size_t>& send, void* out,
                const std::vector<size_t>& recv) {
  const int n = h.size(), me = h.rank();
  HP_CHECK(static_cast<int>(send.size()) == n && static_cast<int>(recv.size()) == n)
      << "all_to_all on " << h.what() << ": " << send.size() << " send and " << recv.size() << " receive sizes for "
      << n << " ranks";
  h.announce(all_to_all_call());
  std::vector<size_t> in_at(n, 0), out_at(n, 0);
  for (int r = 1; r < n; ++r) in_at[r] = in_at[r - 1] + send[r - 1], out_at[r] = out_at[r - 1] + recv[r - 1];
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  // Each step moves up to `piece` bytes of every pair; the window holds one slot per peer.
  const size_t piece = h.step_bytes() / n / 64 * 64;
  // Empty pieces are skipped: an empty tensor's pointer may be null, which memcpy forbids.
  auto stage = [&](int p, size_t off) {
    for (int s = 0; s < n; ++s)
      if (const size_t len = clamp_len(send[s], off, piece); s != me && len)
        std::memcpy(h.scratch(me, p) + s * piece, src + in_at[s] + off, len);
  };
  auto unstage = [&](int p, size_t off) {
    for (int r = 0; r < n; ++r)
      if (const size_t len = clamp_len(recv[r], off, piece); r != me && len)
        std::memcpy(dst + out_at[r] + off, h.scratch(r, p) + me * piece, len);
  };

  // The sizes go out with the first step's data, under one barrier: a small all-to-all
  // is one barrier. A rank skips staging where its pieces will likely move once
  // (skips_staging); which path runs is known only after the barrier, and if it is the
  // windows after all, the ranks that skipped stage then, under one barrier more.
  const int row = h.next_exchange();
  Control& mine = h.control(me);
  for (int s = 0; s < n; ++s) mine.sizes[row][s] = send[s];
  publish(h, row, in, std::accumulate(send.begin(), send.end(), size_t{0}));
  publish_output(h, row, out, std::accumulate(recv.begin(), recv.end(), size_t{0}));
  const int first = h.next_parity();
  const bool skipped = skips_staging(h, row, me);
  if (!skipped) stage(first, 0);
  h.barrier("all_to_all");
  size_t most = 0;
  for (int r = 0; r < n; ++r) {
    const Control& c = h.control(r);
    HP_CHECK(c.sizes[row][me] == recv[r])
        << "all_to_all on " << h.what() << ": expects " << recv[r] << " bytes from group rank " << r
        << ", which sends " << c.sizes[row][me];
    for (int s = 0; s < n; ++s)
      if (r != s) most = std::max<size_t>(most, c.sizes[row][s]);
  }
  copy_large(dst + out_at[me], src + in_at[me], send[me]);
  auto sends = [&](int s, int r) { return h.control(s).sizes[row][r] > 0; };
  if (most >= kSingleCopyBytes && (h.single_copy() || every_piece_reachable(h, row, sends))) {
    // Each piece moves once, straight from its sender's input to its receiver's output:
    // read by the receiver where the input is in the heap (a plain copy) or else, where the
    // output is not, with a system call; written by the sender into an output in the heap
    // otherwise. The sizes every rank published say where each piece starts. The barrier
    // keeps every input unchanged, and every output unread, until all pieces have moved.
    for (int i = 1; i < n; ++i) {
      const int r = visit(h, i);
      const Control& c = h.control(r);
      if (recv[r] && receiver_reads(h, row, r, me)) {
        uint64_t from = 0;
        for (int s = 0; s < me; ++s) from += c.sizes[row][s];
        copy_from_peer(h, row, r, from, dst + out_at[r], recv[r], "all_to_all");
      }
      if (send[r] && !receiver_reads(h, row, me, r)) {
        // Rank r's output must hold what its senders send, or this write would land past it.
        uint64_t to = 0, into = 0;
        for (int q = 0; q < n; ++q) (q < me ? to : into) += h.control(q).sizes[row][r];
        HP_CHECK(to + into == c.out_bytes[row])
            << "all_to_all on " << h.what() << ": group rank " << r << " receives " << c.out_bytes[row]
            << " bytes, its senders send " << to + into;
        copy_large(peer_output(h, row, r) + to, src + in_at[r], send[r]);
      }
    }
    h.barrier("all_to_all");
    return;
  }
  bool late = false;
  for (int r = 0; r < n; ++r) late = late || skips_staging(h, row, r);
  if (late) {
    if (skipped) stage(first, 0);
    h.barrier("all_to_all");
  }
  unstage(first, 0);
  for (size_t off = piece; off < most; off += piece) {
    const int p = h.next_parity();
    stage(p, off);
    h.barrier("all_to_all");
    unstage(p, off);
  }
}

}  // namespace hp::symm
