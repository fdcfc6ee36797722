#include "hp/comm/symm/peers.h"

#include "hp/base/error.h"
#include "hp/comm/symm/cross_memory.h"
#include "hp/comm/symm/stream_copy.h"

namespace hp::symm {
namespace {

// Where [p, p + bytes) lies in this rank's heap, as peers find it: its offset from user()
// plus one, or 0 where it is not there (`p` null: not to be reached in place).
uint64_t heap_place(const Heap& h, const void* p, size_t bytes) {
  const char* at = static_cast<const char*>(p);
  return at && h.holds(at, bytes) ? static_cast<uint64_t>(at - h.user(h.rank())) + 1 : 0;
}

}  // namespace

void publish(Heap& h, int row, const void* p, size_t bytes) {
  Control& c = h.control(h.rank());
  c.heap_at[row] = bytes == 0 ? 1 : heap_place(h, p, bytes);
  c.send_addr[row] = reinterpret_cast<uint64_t>(p);
}

void publish_output(Heap& h, int row, const void* p, size_t bytes) {
  Control& c = h.control(h.rank());
  c.out_at[row] = heap_place(h, p, bytes);
  c.out_bytes[row] = bytes;
}

std::vector<char*> heap_buffers(const Heap& h, int row) {
  std::vector<char*> at(h.size());
  for (int r = 0; r < h.size(); ++r) {
    if (!input_in_heap(h, row, r)) return {};
    at[r] = peer_input(h, row, r);
  }
  return at;
}

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

std::vector<const char*> peer_windows(const Heap& h, int parity, size_t byte_off) {
  std::vector<const char*> p(h.size());
  for (int r = 0; r < h.size(); ++r) p[r] = h.scratch(r, parity) + byte_off;
  return p;
}

}  // namespace hp::symm
