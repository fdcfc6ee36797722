// Reduce-scatter over the symmetric heap. Paths (the table is in collectives.h):
//   in heap   from 256 KiB, pieces back to back in the heap on every rank: each rank folds
//             its piece reading every rank's input in place; two barriers.
//   windows   otherwise: each step moves a slice of every piece through the windows and
//             every rank folds its own; one barrier per step.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "hp/base/error.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/fold.h"
#include "hp/comm/symm/peers.h"
#include "hp/comm/symm/stream_copy.h"

namespace hp::symm {

void reduce_scatter(Heap& h, const at::Tensor& in, at::Tensor out, const std::vector<int64_t>& counts,
                    ReduceOp op) {
  std::vector<const char*> pieces(counts.size());
  const char* src = static_cast<const char*>(in.data_ptr());
  for (size_t r = 0, off = 0; r < counts.size(); off += counts[r] * in.element_size(), ++r) pieces[r] = src + off;
  reduce_scatter(h, pieces, counts, out.data_ptr(), in.scalar_type(), op);
}

void reduce_scatter(Heap& h, const std::vector<const char*>& in, const std::vector<int64_t>& counts, void* out,
                    at::ScalarType dtype, ReduceOp op) {
  const int n = h.size(), me = h.rank();
  HP_CHECK(static_cast<int>(counts.size()) == n && static_cast<int>(in.size()) == n)
      << "reduce_scatter on " << h.what() << ": " << counts.size() << " counts and " << in.size()
      << " pieces for " << n << " ranks";
  const size_t elem = c10::elementSize(dtype);
  char* dst = static_cast<char*>(out);
  std::vector<int64_t> at(n + 1, 0);  // where each piece starts, were they back to back
  for (int r = 0; r < n; ++r) at[r + 1] = at[r] + counts[r];
  h.announce(reduce_scatter_call(counts, dtype, op));
  if (at[n] == 0) return h.barrier("reduce_scatter");
  if (may_read_in_place(h, at[n] * elem)) {
    // Pieces back to back in the heap on every rank: each rank folds its piece reading
    // every rank's input in place, with no staging.
    bool back_to_back = true;
    for (int r = 0; r < n; ++r) back_to_back = back_to_back && in[r] == in[0] + at[r] * elem;
    const int row = h.next_exchange();
    publish(h, row, back_to_back ? in[0] : nullptr, at[n] * elem);
    h.barrier("reduce_scatter");
    if (const std::vector<char*> bufs = heap_buffers(h, row); !bufs.empty()) {
      std::vector<const char*> srcs(n);
      for (int s = 0; s < n; ++s) srcs[s] = bufs[s] + at[me] * elem;
      fold(dst, srcs, counts[me], dtype, op);
      h.barrier("reduce_scatter");  // no rank changes its input before every peer has read it
      return;
    }
  }
  // Each step moves the next `slice` elements of every piece, so all ranks fold at once.
  // The window holds one slot per destination rank; a rank's own contribution to its own
  // piece is read in place.
  const int64_t fits = static_cast<int64_t>(h.step_bytes() / n / elem);
  const int64_t slice = fits >= 16 ? fits / 16 * 16 : std::max<int64_t>(fits, 1);  // 16 keeps copies aligned
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  std::vector<const char*> srcs(n);
  for (int64_t off = 0; off < most; off += slice) {
    const int p = h.next_parity();
    for (int r = 0; r < n; ++r) {
      const int64_t len = std::clamp<int64_t>(counts[r] - off, 0, slice);
      if (r != me && len) std::memcpy(h.scratch(me, p) + r * slice * elem, in[r] + off * elem, len * elem);
    }
    h.barrier("reduce_scatter");
    const int64_t len = std::clamp<int64_t>(counts[me] - off, 0, slice);
    if (!len) continue;
    for (int s = 0; s < n; ++s) srcs[s] = s == me ? in[me] + off * elem : h.scratch(s, p) + me * slice * elem;
    fold(dst + off * elem, srcs, len, dtype, op);
  }
}

}  // namespace hp::symm
