// All-gather over the symmetric heap. Paths (the table is in collectives.h):
//   in place  from 256 KiB, where every piece has its input or its output in the heap:
//             each piece moves once, read by its receivers or written by its sender; two
//             barriers.
//   windows   otherwise: a window of every rank's piece per step; one barrier per step.
#include <ATen/ATen.h>

#include <cstring>
#include <numeric>

#include "hp/base/error.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/peers.h"
#include "hp/comm/symm/stream_copy.h"

namespace hp::symm {

void all_gather(Heap& h, const void* in, const std::vector<size_t>& bytes, void* out) {
  std::vector<char*> dst(bytes.size());
  for (size_t r = 0, off = 0; r < bytes.size(); off += bytes[r], ++r) dst[r] = static_cast<char*>(out) + off;
  all_gather(h, in, bytes, dst);
}

void all_gather(Heap& h, const void* in, const std::vector<size_t>& bytes, const std::vector<char*>& out) {
  const int n = h.size(), me = h.rank();
  HP_CHECK(static_cast<int>(bytes.size()) == n && static_cast<int>(out.size()) == n)
      << "all_gather on " << h.what() << ": " << bytes.size() << " sizes and " << out.size() << " outputs for "
      << n << " ranks";
  const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
  h.announce(all_gather_call(bytes));
  if (total == 0) return h.barrier("all_gather");
  if (may_read_in_place(h, total)) {
    // Each piece moves once, straight from its sender's input to its receivers' outputs:
    // read by each receiver where the input is in the heap, else written by the sender
    // into outputs in the heap (hp::comm allocates its outputs there). A piece with
    // neither goes, with all the others, through the windows. (Staging a large private
    // input in the heap first gained at most 1.1x, within this machine's noise.)
    bool back_to_back = true;
    for (int r = 1; r < n; ++r) back_to_back = back_to_back && out[r] == out[r - 1] + bytes[r - 1];
    const int row = h.next_exchange();
    publish(h, row, in, bytes[me]);
    publish_output(h, row, back_to_back ? out[0] : nullptr, total);
    h.barrier("all_gather");  // every rank's sizes are this rank's (agreement.h)
    if (every_piece_reachable(h, row, [&](int s, int) { return bytes[s] > 0; })) {
      const size_t mine_at = std::accumulate(bytes.begin(), bytes.begin() + me, size_t{0});
      for (int i = 0; i < n; ++i) {
        const int r = visit(h, i);
        if (r == me) {
          if (bytes[me] && out[me] != in) copy_large(out[me], in, bytes[me]);
          continue;
        }
        if (bytes[r] && receiver_reads(h, row, r, me)) copy_large(out[r], peer_input(h, row, r), bytes[r]);
        if (bytes[me] && !receiver_reads(h, row, me, r)) copy_large(peer_output(h, row, r) + mine_at, in, bytes[me]);
      }
      h.barrier("all_gather");  // every piece has landed, and no input is still being read
      return;
    }
  }
  const size_t most = *std::max_element(bytes.begin(), bytes.end());
  if (bytes[me]) copy_large(out[me], in, bytes[me]);
  const size_t window = h.step_bytes();
  for (size_t off = 0; off < most; off += window) {
    const int p = h.next_parity();
    // Empty pieces are skipped: an empty tensor's pointer may be null, which memcpy forbids.
    if (const size_t len = clamp_len(bytes[me], off, window))
      std::memcpy(h.scratch(me, p), static_cast<const char*>(in) + off, len);
    h.barrier("all_gather");
    for (int r = 0; r < n; ++r)
      if (const size_t len = clamp_len(bytes[r], off, window); r != me && len)
        std::memcpy(out[r] + off, h.scratch(r, p), len);
  }
}

}  // namespace hp::symm
