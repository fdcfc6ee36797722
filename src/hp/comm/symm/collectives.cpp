#include "hp/comm/symm/collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>

#include "hp/base/error.h"
#include "hp/comm/group.h"
#include "hp/comm/symm/cross_memory.h"
#include "hp/comm/symm/fold.h"
#include "hp/comm/symm/stream_copy.h"
#include "hp/comm/symm/symm.h"

namespace hp::symm {
namespace {

// Below this, every rank folds the whole message (one barrier) instead of its slice
// followed by an all-gather (two barriers): latency matters more than bytes.
constexpr size_t kOneShotBytes = 256 << 10;

// From this size of the largest piece, all-to-all reads each piece once from its sender's
// buffer (a system call per peer and one more barrier) instead of twice through windows.
constexpr size_t kSingleCopyBytes = 64 << 10;

// From this size of a message (or one step, if smaller), a collective first asks whether
// every rank's buffer lies in the symmetric heap (one barrier more) and then reads its
// peers' buffers in place.
constexpr size_t kInPlaceBytes = 256 << 10;
bool may_read_in_place(const Heap& h, size_t bytes) { return bytes >= std::min(kInPlaceBytes, h.step_bytes()); }

// From this many steps, all-reduce may stage a private tensor in the heap (one copy) and
// read it in place from there: three barriers instead of one per step, and long streamed
// copies instead of small ones that stay in cache. Which wins depends on where the ranks
// run: with cores apart, staging (1.3-1.6x faster at 16-64 MiB at 2 ranks, 1.1-1.5x from
// 1 MiB at 4 ranks on 2 cores); with two threads of one core sharing a cache, the
// windows (staging 0.6-0.75x). This VM's host flips between the two, so the choice is
// timed (PathChoice). HP_SHM_STAGING=0 or 1 fixes it.
constexpr size_t kStagedSteps = 4;
bool may_stage(const Heap& h, size_t bytes) { return bytes >= kStagedSteps * h.step_bytes(); }

// All-reduce through the windows moves this many steps between barriers: each rank folds
// only 1/n of a step, so with one step the barriers cost more than the smaller copies
// save (4 steps: mostly 1.05-1.25x faster at 1-64 MiB, 2 and 4 ranks). Reduce-scatter
// gained nothing measurable; broadcast, whose receivers copy each step whole, lost 2x.
constexpr size_t kFoldSteps = 4;
size_t fold_step(const Heap& h) { return std::min(h.scratch_bytes(), kFoldSteps * h.step_bytes()); }

// Rank 0 times the large all-reduces of private tensors and publishes, per message size,
// whether the next ones stage or take the windows: each way twice at first, then the
// faster so far, but every 16th call the other, so that a change of placement shows.
// Every rank reads the choice rank 0 wrote during the previous such call (two slots in
// turn), so all take the same way; a rank that took the other would cost time, not bits.
class PathChoice {
 public:
  static constexpr int kStaged = 0, kWindows = 1;

  // Collective: every rank calls it for the same all-reduces (by size), in order.
  PathChoice(Heap& h, size_t bytes)
      : h_(h), bucket_(std::min(63, 63 - __builtin_clzll(bytes))), start_(std::chrono::steady_clock::now()) {
    const char* v = std::getenv("HP_SHM_STAGING");  // read each time: tests and benchmarks set it
    forced_ = v && std::string(v) == "0" ? kWindows : v && std::string(v) == "1" ? kStaged : -1;
    const int slot = h.next_choice_slot();
    path_ = forced_ >= 0 ? forced_ : h.control(0).staging_choice[slot][bucket_];
    // Rank 0 may write the other slot now: every rank read it before the last call's end.
    if (h.rank() == 0 && forced_ < 0) publish(slot ^ 1);
  }
  bool stage() const { return path_ == kStaged; }
  // Rank 0, when the call went the chosen way with its own tensor private: its time counts.
  void took(int path) {
    if (h_.rank() != 0 || forced_ >= 0 || path != path_) return;
    auto& t = h_.path_times();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    // A running minimum that creeps up 5% a call: a slow first call (pages touched for the
    // first time) is forgotten at the next good one, a lasting slowdown shows in ~15 calls.
    double& best = t.seconds[bucket_][path];
    best = best == 0 ? s : std::min(s, best * 1.05);
    ++t.calls[bucket_];
  }

 private:
  void publish(int slot) {
    const auto& t = h_.path_times();
    for (int b = 0; b < 64; ++b) {
      const double staged = t.seconds[b][kStaged], windows = t.seconds[b][kWindows];
      int way = windows > 0 && windows < staged ? kWindows : kStaged;
      if (t.calls[b] < 4) way = static_cast<int>(t.calls[b] % 2);  // each way twice, first
      else if (t.calls[b] % 16 == 15) way = 1 - way;
      h_.control(0).staging_choice[slot][b] = static_cast<uint8_t>(way);
    }
  }

  Heap& h_;
  int bucket_;
  std::chrono::steady_clock::time_point start_;
  int forced_ = -1, path_ = kStaged;
};

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

size_t clamp_len(size_t total, size_t off, size_t window) { return off >= total ? 0 : std::min(window, total - off); }

std::vector<const char*> peer_ptrs(const Heap& h, int parity, size_t byte_off) {
  std::vector<const char*> p(h.size());
  for (int r = 0; r < h.size(); ++r) p[r] = h.scratch(r, parity) + byte_off;
  return p;
}

// Where [p, p + bytes) lies in this rank's heap, as peers find it: its offset from user()
// plus one, or 0 where it is not there (`p` null: not to be reached in place).
uint64_t heap_place(const Heap& h, const void* p, size_t bytes) {
  const char* at = static_cast<const char*>(p);
  return at && h.holds(at, bytes) ? static_cast<uint64_t>(at - h.user(h.rank())) + 1 : 0;
}

// Publishes, in exchange row `row`, the buffer this rank's peers read: where it lies in
// its heap (heap_place) and its address for cross-memory reads and writes. An empty buffer
// counts as in the heap: there is nothing to read.
void publish(Heap& h, int row, const void* p, size_t bytes) {
  Control& c = h.control(h.rank());
  c.heap_at[row] = bytes == 0 ? 1 : heap_place(h, p, bytes);
  c.send_addr[row] = reinterpret_cast<uint64_t>(p);
}

// Publishes, in row `row`, where this rank's output lies in its heap (null or elsewhere:
// 0) and its size, so that peers can write into it.
void publish_output(Heap& h, int row, const void* p, size_t bytes) {
  Control& c = h.control(h.rank());
  c.out_at[row] = heap_place(h, p, bytes);
  c.out_bytes[row] = bytes;
}

// After the barrier that follows publishing: whether rank r's input (output) is in its
// heap, and where, as this rank maps it.
bool input_in_heap(const Heap& h, int row, int r) { return h.control(r).heap_at[row] != 0; }
bool output_in_heap(const Heap& h, int row, int r) { return h.control(r).out_at[row] != 0; }
char* peer_input(const Heap& h, int row, int r) { return h.user(r) + (h.control(r).heap_at[row] - 1); }
char* peer_output(const Heap& h, int row, int r) { return h.user(r) + (h.control(r).out_at[row] - 1); }

// Copies `bytes` from offset `from` of rank r's published buffer into `dst`, or from `src`
// to offset `to` of it: a plain copy where it is in r's heap, else a cross-memory one.
void copy_from_peer(const Heap& h, int row, int r, uint64_t from, void* dst, size_t bytes, const char* op) {
  if (input_in_heap(h, row, r)) return copy_large(dst, peer_input(h, row, r) + from, bytes);
  const Control& c = h.control(r);
  HP_CHECK(read_peer(c.pid, c.send_addr[row] + from, dst, bytes))
      << op << " on " << h.what() << ": cannot read " << bytes << " bytes from group rank " << r << " (pid "
      << c.pid << ")";
}
void copy_to_peer(const Heap& h, int row, int r, uint64_t to, const void* src, size_t bytes, const char* op) {
  if (input_in_heap(h, row, r)) return copy_large(peer_input(h, row, r) + to, src, bytes);
  const Control& c = h.control(r);
  HP_CHECK(write_peer(c.pid, c.send_addr[row] + to, src, bytes))
      << op << " on " << h.what() << ": cannot write " << bytes << " bytes to group rank " << r << " (pid "
      << c.pid << ")";
}

// Every rank's published buffer, as this rank maps it, or nothing if any rank's is not in
// its heap. All ranks reach the same answer.
std::vector<char*> heap_buffers(const Heap& h, int row) {
  std::vector<char*> at(h.size());
  for (int r = 0; r < h.size(); ++r) {
    if (!input_in_heap(h, row, r)) return {};
    at[r] = peer_input(h, row, r);
  }
  return at;
}

// Who moves the piece from rank s to rank r when it moves once, straight from input to
// output: r reads it where s's input is in the heap, else s writes it where r's output
// is. Both sides reach the same answer from what was published.
bool receiver_reads(const Heap& h, int row, int s, int r) {
  return input_in_heap(h, row, s) || !output_in_heap(h, row, r);
}

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

// Whether every non-empty piece (moves(s, r)) has an input or an output in the heap.
template <typename Moves>
bool every_piece_reachable(const Heap& h, int row, Moves moves) {
  for (int s = 0; s < h.size(); ++s)
    for (int r = 0; r < h.size(); ++r)
      if (s != r && moves(s, r) && !input_in_heap(h, row, s) && !output_in_heap(h, row, r)) return false;
  return true;
}

// Where part k starts when `total` units are split over n ranks in parts of a multiple of
// `align` (a power of two) units each, so that copies stay aligned; trailing parts short.
template <typename T>
T part_start(T total, int n, int k, T align) {
  const T per = ((total + n - 1) / n + align - 1) & ~(align - 1);
  return std::min<T>(total, k * per);
}

// Where rank r's slice of `total` elements starts when an all-reduce splits them over n
// ranks: slices of 16 elements.
int64_t slice_start(int64_t total, int n, int r) { return part_start<int64_t>(total, n, r, 16); }

// Peers in the order this rank visits them: itself first, then the next ranks round the
// ring, so that no rank's memory is read by all the others at once.
int visit(const Heap& h, int i) { return (h.rank() + i) % h.size(); }

}  // namespace

bool shm_collectives_enabled(const comm::Group& g) {
  const char* v = std::getenv("HP_SHM_COLLECTIVES");  // read each time: tests and benchmarks flip it
  const bool enabled = !(v && std::string(v) == "0");
  return enabled && g.device() == "cpu" && g.size() >= 2 && g.size() <= kMaxRanks && g.on_one_host();
}

bool can_reduce(at::ScalarType dtype) { return can_fold(dtype); }

at::Tensor try_in_place_buffer(int64_t numel, at::ScalarType dtype, const comm::Group& g) {
  if (!shm_collectives_enabled(g) || !can_reduce(dtype)) return at::Tensor();
  return try_empty({numel}, dtype, g);
}

at::Tensor try_output_buffer(int64_t numel, at::ScalarType dtype, const comm::Group& g) {
  if (numel * static_cast<int64_t>(c10::elementSize(dtype)) < static_cast<int64_t>(kInPlaceBytes)) return {};
  return try_local_empty(numel, dtype, g);
}

namespace {

// Every rank's tensor is readable in the heap at at[r]: the tensor itself, or a copy of the
// slices its peers fold (staged). Each rank folds its slice reading its own tensor and its
// peers' buffers in place, then copies their folded slices: one copy per byte crosses
// between ranks. Two barriers: slices folded, slices read (a rank may change its buffer
// only after every peer has read it).
void all_reduce_in_heap(Heap& h, char* data, int64_t total, at::ScalarType dtype, ReduceOp op,
                        const std::vector<char*>& at) {
  const int n = h.size(), me = h.rank();
  const size_t elem = c10::elementSize(dtype);
  auto lo = [&](int r) { return slice_start(total, n, r) * static_cast<int64_t>(elem); };
  // The fold may not alias its inputs. It lands, a window at a time, where this rank's
  // peers read it, and is copied to the tensor while in cache: in the staging buffer's own
  // slice, which holds no input, or, for a tensor in the heap, in the window, copied back.
  const bool staged = at[me] != data;
  const int64_t piece = static_cast<int64_t>(h.step_bytes() / elem * elem);
  std::vector<const char*> srcs(n);
  for (int64_t a = lo(me); a < lo(me + 1); a += piece) {
    const int64_t len = std::min(piece, lo(me + 1) - a);
    for (int s = 0; s < n; ++s) srcs[s] = (s == me ? data : at[s]) + a;
    char* folded = staged ? at[me] + a : h.scratch(me, 0);
    fold(folded, srcs, len / static_cast<int64_t>(elem), dtype, op);
    std::memcpy(data + a, folded, len);
  }
  h.barrier("all_reduce");
  for (int i = 1; i < n; ++i) {
    const int r = visit(h, i);
    copy_large(data + lo(r), at[r] + lo(r), lo(r + 1) - lo(r));
  }
  h.barrier("all_reduce");
}

}  // namespace

void all_reduce(Heap& h, at::Tensor t, ReduceOp op) {
  const int n = h.size(), me = h.rank();
  const auto dtype = t.scalar_type();
  const size_t elem = t.element_size();
  const int64_t total = t.numel();
  char* data = static_cast<char*>(t.data_ptr());
  const size_t bytes = total * elem;
  h.announce(all_reduce_call(bytes, dtype, op));
  if (total == 0) return h.barrier("all_reduce");
  const bool one_shot = bytes <= std::min(kOneShotBytes, h.step_bytes());
  // A large private tensor may be staged: the slices its peers fold, copied into the heap.
  std::optional<PathChoice> choice;
  if (!one_shot && may_stage(h, bytes)) choice.emplace(h, bytes);
  const bool private_tensor = !h.holds(data, bytes);
  Staging stage(h, choice && choice->stage() && private_tensor ? bytes : 0);
  if (stage.data())
    for (int i = 1; i < n; ++i) {
      const int r = visit(h, i);
      const int64_t lo = slice_start(total, n, r), hi = slice_start(total, n, r + 1);
      copy_large(stage.data() + lo * elem, data + lo * elem, (hi - lo) * elem);
    }
  const int row = h.next_exchange();
  publish(h, row, stage.data() ? stage.data() : data, bytes);
  // Where this rank's buffer is in the heap, a barrier tells whether every rank's is; if
  // one is not, the windows carry the tensor, and that rank (which staged its first window
  // before its first barrier) waits one barrier more, for this rank to stage its own.
  const bool mine_in_heap = !one_shot && input_in_heap(h, row, me);
  if (mine_in_heap) {
    h.barrier("all_reduce");
    if (const std::vector<char*> at = heap_buffers(h, row); !at.empty()) {
      all_reduce_in_heap(h, data, total, dtype, op, at);
      if (choice && private_tensor) choice->took(PathChoice::kStaged);
      return;
    }
  }
  // Input in the first half of the window, folded slices in the second.
  const size_t folded = fold_step(h) / 2;
  const int64_t chunk = static_cast<int64_t>(folded / elem);
  if (one_shot) {
    for (int64_t off = 0; off < total; off += chunk) {
      const int64_t len = std::min(chunk, total - off);
      char* in = data + off * elem;
      const int p = h.next_parity();
      std::memcpy(h.scratch(me, p), in, len * elem);
      h.barrier("all_reduce");
      fold(in, peer_ptrs(h, p, 0), len, dtype, op);
    }
    return;
  }
  // Each step, every rank stages the slices of a chunk its peers fold (slice_start),
  // passes a barrier, copies its peers' folded slices of the previous chunk back, and
  // folds its own slice of this one (reading its own input in place) into the second half
  // of its window: one barrier per step, and one more before the last chunk's folded
  // slices are copied back.
  auto lo = [n](int64_t len, int r) { return slice_start(len, n, r); };
  auto collect = [&](int64_t off, int p) {
    const int64_t len = std::min(chunk, total - off);
    for (int r = 0; r < n; ++r)
      if (r != me)
        std::memcpy(data + (off + lo(len, r)) * elem, h.scratch(r, p) + folded + lo(len, r) * elem,
                    (lo(len, r + 1) - lo(len, r)) * elem);
  };
  std::vector<const char*> srcs(n);
  int64_t off = 0;
  int p = 0;
  for (; off < total; off += chunk) {
    const int64_t len = std::min(chunk, total - off);
    char* in = data + off * elem;
    const int prev = p;
    p = h.next_parity();
    for (int r = 0; r < n; ++r)
      if (r != me)
        std::memcpy(h.scratch(me, p) + lo(len, r) * elem, in + lo(len, r) * elem, (lo(len, r + 1) - lo(len, r)) * elem);
    h.barrier("all_reduce");
    if (off == 0 && !mine_in_heap)
      for (int r = 0; r < n; ++r)
        if (input_in_heap(h, row, r)) {
          h.barrier("all_reduce");
          break;
        }
    if (off > 0) collect(off - chunk, prev);
    for (int s = 0; s < n; ++s) srcs[s] = (s == me ? in : h.scratch(s, p)) + lo(len, me) * elem;
    char* mine = h.scratch(me, p) + folded + lo(len, me) * elem;
    fold(mine, srcs, lo(len, me + 1) - lo(len, me), dtype, op);
    std::memcpy(in + lo(len, me) * elem, mine, (lo(len, me + 1) - lo(len, me)) * elem);
  }
  h.barrier("all_reduce");
  collect(off - chunk, p);
  if (choice && private_tensor && !stage.data()) choice->took(PathChoice::kWindows);
}

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
