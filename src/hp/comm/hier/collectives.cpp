// The hierarchical collectives: in-host phases over the host's symmetric heap, cross-host
// phases over Gloo among the ranks of equal local index, two pieces in flight at a time.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/symm/collectives.h"

namespace hp::comm::hier {
namespace {

// Avg is a sum divided once at the end, as on the flat path (integers truncate once).
ReduceOp fold_op(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }

void finish_avg(at::Tensor t, ReduceOp op, int64_t n) {
  if (op != ReduceOp::Avg) return;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) t.div_(n, "trunc");
  else t.div_(n);
}

int64_t clamp_len(int64_t total, int64_t off, int64_t step) { return std::max<int64_t>(0, std::min(step, total - off)); }

// Runs piece k's in-host phase before it and launches its cross-host phase, then finishes
// piece k-1 (waits for it, in-host phase after): the network works on one piece while
// this thread prepares the next. Every rank of a host runs the in-host phases in the same
// order, which the shared-memory barriers need.
template <typename Before, typename Across, typename After>
void pipeline(int64_t pieces, Before&& before, Across&& across, After&& after) {
  std::vector<Pending> flying(pieces);
  for (int64_t k = 0; k < pieces; ++k) {
    before(k);
    flying[k] = across(k);
    if (k > 0) after(k - 1, flying[k - 1].wait());
  }
  if (pieces > 0) after(pieces - 1, flying[pieces - 1].wait());
}

}  // namespace

void all_reduce(const Group& g, at::Tensor t, ReduceOp op) {
  detail::count_call();
  const HostLevels& lv = host_levels(g);
  symm::Heap& heap = *symm::group_heap(*lv.inner);
  const int L = lv.per_host;
  const auto dtype = t.scalar_type();
  const int64_t elem = t.element_size(), total = t.numel();
  // Pieces and slices in whole 16-element runs, so that in-host copies stay aligned.
  const int64_t piece = std::max<int64_t>(16 * L, static_cast<int64_t>(piece_bytes()) / elem / (16 * L) * (16 * L));
  const int64_t pieces = (total + piece - 1) / piece;
  auto slices_of = [&](int64_t k) {  // local rank l's slice of piece k: [lo[l], lo[l + 1])
    const int64_t len = clamp_len(total, k * piece, piece);
    const int64_t per = ((len + L - 1) / L + 15) / 16 * 16;
    std::vector<int64_t> lo(L + 1);
    for (int l = 0; l <= L; ++l) lo[l] = std::min(len, l * per);
    return lo;
  };
  // This rank's slice of every piece, back to back: reduced over its host, then across hosts.
  std::vector<int64_t> slice_at(pieces + 1, 0);
  for (int64_t k = 0; k < pieces; ++k) {
    auto lo = slices_of(k);
    slice_at[k + 1] = slice_at[k] + lo[lv.local + 1] - lo[lv.local];
  }
  at::Tensor slices = g.buffer(std::max<int64_t>(1, slice_at[pieces]), t.options());
  char* data = static_cast<char*>(t.data_ptr());
  char* mine = static_cast<char*>(slices.data_ptr());
  const ReduceOp inner_op = fold_op(op);

  pipeline(
      pieces,
      [&](int64_t k) {
        auto lo = slices_of(k);
        std::vector<const char*> in(L);
        std::vector<int64_t> counts(L);
        for (int l = 0; l < L; ++l) in[l] = data + (k * piece + lo[l]) * elem, counts[l] = lo[l + 1] - lo[l];
        symm::reduce_scatter(heap, in, counts, mine + slice_at[k] * elem, dtype, inner_op);
      },
      [&](int64_t k) {
        const int64_t n = slice_at[k + 1] - slice_at[k];  // the same on every rank of the outer group
        return n > 0 ? all_reduce_async(slices.narrow(0, slice_at[k], n), *lv.outer, inner_op) : Pending();
      },
      [&](int64_t k, const at::Tensor&) {
        auto lo = slices_of(k);
        std::vector<size_t> bytes(L);
        for (int l = 0; l < L; ++l) bytes[l] = (lo[l + 1] - lo[l]) * elem;
        symm::all_gather(heap, mine + slice_at[k] * elem, bytes, data + k * piece * elem);
      });
  finish_avg(t, op, g.size());
}

void all_gather(const Group& g, const void* in, const std::vector<size_t>& bytes, void* out) {
  detail::count_call();
  const HostLevels& lv = host_levels(g);
  symm::Heap& heap = *symm::group_heap(*lv.inner);
  const int L = lv.per_host, H = lv.hosts, n = g.size();
  std::vector<int64_t> start(n + 1, 0);  // where each rank's bytes go in `out`
  for (int r = 0; r < n; ++r) start[r + 1] = start[r] + static_cast<int64_t>(bytes[r]);
  const int64_t most = static_cast<int64_t>(*std::max_element(bytes.begin(), bytes.end()));
  // A piece: up to `step` bytes of every rank's contribution, about piece_bytes() of output.
  const int64_t step = std::max<int64_t>(64, static_cast<int64_t>(piece_bytes()) / n / 64 * 64);
  const int64_t pieces = (most + step - 1) / step;
  auto len = [&](int r, int64_t k) { return clamp_len(static_cast<int64_t>(bytes[r]), k * step, step); };
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);

  pipeline(
      pieces, [](int64_t) {},
      [&](int64_t k) {
        // Across hosts first: every rank's piece to the ranks of its local index.
        std::vector<int64_t> sizes(H);
        for (int h = 0; h < H; ++h) sizes[h] = len(h * L + lv.local, k);
        if (std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) == 0) return Pending();
        at::Tensor piece = at::from_blob(const_cast<char*>(src) + k * step, {sizes[lv.host]}, at::kByte);
        return all_gather_async(piece, *lv.outer, 0, sizes);  // copies `piece` before it returns
      },
      [&](int64_t k, const at::Tensor& got) {
        // Then inside the host: what arrived from host h goes to every local rank.
        const char* from = got.defined() ? static_cast<const char*>(got.data_ptr()) : nullptr;
        for (int h = 0; h < H; ++h) {
          std::vector<size_t> b(L);
          std::vector<char*> to(L);
          for (int l = 0; l < L; ++l) b[l] = len(h * L + l, k), to[l] = dst + start[h * L + l] + k * step;
          symm::all_gather(heap, from, b, to);
          if (from) from += b[lv.local];
        }
      });
}

void reduce_scatter(const Group& g, const at::Tensor& in, const std::vector<int64_t>& counts, at::Tensor out,
                    ReduceOp op) {
  detail::count_call();
  const HostLevels& lv = host_levels(g);
  symm::Heap& heap = *symm::group_heap(*lv.inner);
  const int L = lv.per_host, H = lv.hosts, n = g.size();
  const auto dtype = in.scalar_type();
  const int64_t elem = in.element_size();
  std::vector<int64_t> first(n + 1, 0);
  for (int r = 0; r < n; ++r) first[r + 1] = first[r] + counts[r];
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  // A piece: up to `step` elements of every rank's part, about piece_bytes() of input.
  const int64_t step = std::max<int64_t>(16, static_cast<int64_t>(piece_bytes()) / elem / n / 16 * 16);
  const int64_t pieces = (most + step - 1) / step;
  auto len = [&](int r, int64_t k) { return clamp_len(counts[r], k * step, step); };
  // Piece k of the parts for this local index on every host, each reduced over this host.
  std::vector<int64_t> stage_at(pieces + 1, 0);
  for (int64_t k = 0; k < pieces; ++k) {
    stage_at[k + 1] = stage_at[k];
    for (int h = 0; h < H; ++h) stage_at[k + 1] += len(h * L + lv.local, k);
  }
  at::Tensor stage = g.buffer(std::max<int64_t>(1, stage_at[pieces]), in.options());
  const char* src = static_cast<const char*>(in.data_ptr());
  char* staged = static_cast<char*>(stage.data_ptr());
  at::Tensor flat_out = out.view({-1});
  const ReduceOp inner_op = fold_op(op);

  pipeline(
      pieces,
      [&](int64_t k) {
        // Inside the host first: local rank l gets the host's sum of piece k of the parts of
        // rank l on every host.
        int64_t pos = stage_at[k];
        for (int h = 0; h < H; ++h) {
          std::vector<const char*> parts(L);
          std::vector<int64_t> c(L);
          for (int l = 0; l < L; ++l) parts[l] = src + (first[h * L + l] + k * step) * elem, c[l] = len(h * L + l, k);
          symm::reduce_scatter(heap, parts, c, staged + pos * elem, dtype, inner_op);
          pos += c[lv.local];
        }
      },
      [&](int64_t k) {
        // Then across hosts: host h's rank of this local index gets its part summed over hosts.
        std::vector<int64_t> sizes(H);
        for (int h = 0; h < H; ++h) sizes[h] = len(h * L + lv.local, k);
        const int64_t total = stage_at[k + 1] - stage_at[k];
        return total > 0 ? reduce_scatter_async(stage.narrow(0, stage_at[k], total), *lv.outer, 0, inner_op, sizes)
                         : Pending();
      },
      [&](int64_t k, const at::Tensor& got) {
        if (got.defined() && got.numel() > 0) flat_out.narrow(0, k * step, got.numel()).copy_(got);
      });
  finish_avg(out, op, n);
}

}  // namespace hp::comm::hier
