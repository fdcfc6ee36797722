#include "hp/comm/symm/agreement.h"

#include <sstream>
#include <string>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/symm/heap.h"

namespace hp::symm {
namespace {

constexpr uint64_t kNone = 0xff;  // no reduce op, dtype or root

uint64_t head(Kind kind, uint64_t op = kNone, uint64_t dtype = kNone, uint64_t root = kNone) {
  return uint64_t(kind) << 24 | (op & 0xff) << 16 | (dtype & 0xff) << 8 | (root & 0xff);
}
Kind kind_of(uint64_t head) { return static_cast<Kind>((head >> 24) & 0xff); }
uint64_t field(uint64_t head, int shift) { return (head >> shift) & 0xff; }
uint64_t call_number(uint64_t head) { return head >> 32; }

// splitmix64's finaliser over the values in turn: sizes that differ anywhere differ here.
uint64_t hash(const uint64_t* v, size_t n) {
  uint64_t h = n;
  for (size_t i = 0; i < n; ++i) {
    h ^= v[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

Call with_pieces(uint64_t head, uint64_t bytes, const uint64_t* pieces, size_t n) {
  return Call{Announcement{head, bytes, hash(pieces, n)}, pieces};
}

std::string describe(const Heap& h, int row, int r) {
  const Announcement& a = h.control(r).calls[row];
  std::ostringstream os;
  os << "call " << call_number(a.head) << ", ";
  const uint64_t op = field(a.head, 16), dtype = field(a.head, 8), root = field(a.head, 0);
  auto reduction = [&] {
    os << " (" << to_string(static_cast<ReduceOp>(op)) << ", " << static_cast<at::ScalarType>(dtype) << ")";
  };
  const uint64_t* pieces = h.control(r).pieces[row];
  auto sizes = [&](const char* unit) {
    os << ", " << unit << " per rank " << to_string_list(std::vector<uint64_t>(pieces, pieces + h.size()));
  };
  switch (kind_of(a.head)) {
    case Kind::Barrier: os << "hp::symm::barrier"; break;
    case Kind::Empty:
      os << "hp::symm::empty of " << a.bytes << " bytes";
      if (a.detail) os << " at offset " << a.detail - 1;
      else os << ", with no room in its heap";
      break;
    case Kind::TryEmpty: os << "hp::symm::try_empty of " << a.bytes << " bytes"; break;
    case Kind::AllReduce: os << "all_reduce"; reduction(); os << " of " << a.bytes << " bytes"; break;
    case Kind::ReduceScatter:
      os << "reduce_scatter";
      reduction();
      os << " of " << a.bytes << " bytes";
      sizes("elements");
      break;
    case Kind::AllGather: os << "all_gather of " << a.bytes << " bytes"; sizes("bytes"); break;
    case Kind::AllToAll: os << "all_to_all"; break;
    case Kind::Broadcast: os << "broadcast of " << a.bytes << " bytes from group rank " << root; break;
    default: os << "an unknown call (" << std::hex << a.head << ")";
  }
  return os.str();
}

}  // namespace

Call all_reduce_call(size_t bytes, at::ScalarType dtype, ReduceOp op) {
  return Call{Announcement{head(Kind::AllReduce, uint64_t(op), uint64_t(dtype)), bytes, 0}};
}

Call reduce_scatter_call(const std::vector<int64_t>& counts, at::ScalarType dtype, ReduceOp op) {
  uint64_t bytes = 0;
  for (int64_t c : counts) bytes += uint64_t(c) * c10::elementSize(dtype);
  // int64_t and uint64_t may alias: the counts are hashed and printed as they lie.
  return with_pieces(head(Kind::ReduceScatter, uint64_t(op), uint64_t(dtype)), bytes,
                     reinterpret_cast<const uint64_t*>(counts.data()), counts.size());
}

Call all_gather_call(const std::vector<size_t>& bytes) {
  static_assert(sizeof(size_t) == sizeof(uint64_t), "sizes are published as 64-bit words");
  uint64_t total = 0;
  for (size_t b : bytes) total += b;
  return with_pieces(head(Kind::AllGather), total, reinterpret_cast<const uint64_t*>(bytes.data()), bytes.size());
}

Call all_to_all_call() { return Call{Announcement{head(Kind::AllToAll), 0, 0}}; }

Call broadcast_call(size_t bytes, int root) {
  return Call{Announcement{head(Kind::Broadcast, kNone, kNone, uint64_t(root)), bytes, 0}};
}

Call barrier_call() { return Call{Announcement{head(Kind::Barrier), 0, 0}}; }

Call empty_call(size_t bytes, std::optional<size_t> offset) {
  return Call{Announcement{head(Kind::Empty), bytes, offset ? *offset + 1 : 0}};
}

Call try_empty_call(size_t bytes) { return Call{Announcement{head(Kind::TryEmpty), bytes, 0}}; }

void check_agreement(const Heap& h, int row, const char* op) {
  const Announcement& mine = h.control(h.rank()).calls[row];
  bool same = true;
  for (int r = 0; r < h.size(); ++r) same = same && h.control(r).calls[row] == mine;
  if (same) return;
  // Ranks that announced the same, in order of their first rank.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < h.size(); ++r) {
    auto g = groups.begin();
    while (g != groups.end() && h.control(g->front()).calls[row] != h.control(r).calls[row]) ++g;
    if (g == groups.end()) groups.push_back({r});
    else g->push_back(r);
  }
  std::ostringstream os;
  os << op << " on " << h.what() << " (group rank " << h.rank()
     << "): the ranks' calls differ (every rank must make the same calls in the same order, with the same "
        "sizes, reduce op, dtype and root):";
  for (const auto& g : groups)
    os << (g.size() > 1 ? " group ranks " : " group rank ") << (g.size() > 1 ? to_string_list(g) : std::to_string(g[0]))
       << " made " << describe(h, row, g.front()) << ";";
  std::string m = os.str();
  m.pop_back();
  HP_FAIL() << m;
}

}  // namespace hp::symm
