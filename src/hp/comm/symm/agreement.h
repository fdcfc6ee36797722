// Agreement among the ranks of a call over the symmetric heap. The shared-memory
// collectives pair ranks' calls by counting barriers: a rank that called another
// collective, or the same one with other sizes, reduce op, dtype or root, would pair
// silently with its peers' call (or their next one), read past their buffers or fold the
// wrong data. So every collective call announces what it was given (Heap::announce), and
// the first barrier it passes compares every rank's announcement with this rank's before
// any data moves between them: where one differs, every rank fails alike, naming what each
// rank passed. The words share the barrier's cache line, which every peer reads anyway.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "hp/base/reduce_op.h"

namespace hp::symm {

class Heap;

enum class Kind : uint8_t { Barrier = 1, Empty, TryEmpty, AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast };

// What a rank publishes for one call, in its control block: three words that every rank
// must match.
struct Announcement {
  uint64_t head = 0;    // the call's number on this heap (high 32 bits), kind, reduce op, dtype, root
  uint64_t bytes = 0;   // the message, in all
  uint64_t detail = 0;  // a hash of the per-rank sizes; hp::symm::empty: its offset + 1 (0: no room)
  bool operator==(const Announcement& o) const { return head == o.head && bytes == o.bytes && detail == o.detail; }
  bool operator!=(const Announcement& o) const { return !(*this == o); }
};

// An announcement and, where it has them, the per-rank sizes it hashes (one per rank of the
// group), which go to the control block too so that an error can print them.
struct Call {
  Announcement words;
  const uint64_t* pieces = nullptr;
};

Call all_reduce_call(size_t bytes, at::ScalarType dtype, ReduceOp op);
// counts[r]: the elements whose reduction goes to rank r.
Call reduce_scatter_call(const std::vector<int64_t>& counts, at::ScalarType dtype, ReduceOp op);
// bytes[r]: what rank r contributes.
Call all_gather_call(const std::vector<size_t>& bytes);
// Sizes differ between ranks by design; all_to_all checks them against each other itself.
Call all_to_all_call();
Call broadcast_call(size_t bytes, int root);
Call barrier_call();
// `offset`: where this rank's allocation landed in the user heap; none without room.
Call empty_call(size_t bytes, std::optional<size_t> offset);
Call try_empty_call(size_t bytes);

// After the barrier that follows the announcements in `row`: fails, naming the calls and
// the ranks that made each, unless every rank announced what this rank did. Every rank
// reads the same words, so all fail or none.
void check_agreement(const Heap& h, int row, const char* op);

}  // namespace hp::symm
