// The symmetric heap of a process group whose ranks share a host: every rank owns one
// shared-memory segment of the same size and maps all of its peers', so a rank reads and
// writes any peer's memory with plain loads and stores.
//
// Each segment holds, in order: a control block (barrier counter, signal slots, a size
// exchange area), a scratch window for collectives (two halves, used in alternate steps),
// the user heap that hp::symm::empty allocates from (at the same offsets on every rank),
// and a local region that each rank allocates from on its own (collective outputs and
// staged inputs), kept apart so that those never move a symmetric tensor's offset.
//
// Memory model: data moves with plain copies; ordering comes only from the 64-bit atomic
// words of the control block (lock-free, hence address-free across processes, as
// [atomics.lockfree] asks). A release store or read-modify-write of a word (barrier
// arrival, signal) publishes every write this rank made before it; an acquire load that
// observes the value (barrier wait, wait_signal) makes those writes visible. This holds on
// any architecture C++ targets: on x86 the compiler emits plain moves, on Arm ldar/stlr.
// Nothing else is ordered: data put to a peer without a signal or barrier after it may
// be seen late or torn.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hp/comm/symm/agreement.h"
#include "hp/comm/symm/segment.h"

namespace hp::comm {
class Group;
}

namespace hp::symm {

constexpr int kMaxRanks = 256;   // per group; larger groups on one host keep Gloo
constexpr int kSignalSlots = 64;

enum class SignalOp { Set, Add };

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");
static_assert(sizeof(uint64_t) + 2 * sizeof(Announcement) <= 64, "announcements share the barrier's cache line");

struct Control {
  uint64_t magic;
  int64_t pid;  // whose segment: a peer that has died is named at once
  alignas(64) std::atomic<uint64_t> barrier;
  // What this rank's last two calls were given (agreement.h), in rows by the call's number:
  // in the barrier's cache line, so peers have them when they see this rank arrive.
  Announcement calls[2];
  alignas(64) std::atomic<uint64_t> signals[kSignalSlots];
  // all_to_all: each rank publishes its send sizes here, in alternate rows per call.
  alignas(64) uint64_t sizes[2][kMaxRanks];
  // Large collectives: the address of the buffer its peers read (for single-copy reads
  // and writes), and where it lies in this rank's user heap (offset + 1), or 0 when it is
  // not in the heap, in alternate rows per call. Its size is the call's (agreement.h).
  uint64_t send_addr[2];
  uint64_t heap_at[2];
  // all_gather and all_to_all: where this rank's output lies past its user heap's start
  // (offset + 1; 0: not in the heap) and its size, so that peers can write into it.
  uint64_t out_at[2];
  uint64_t out_bytes[2];
  // all_reduce of private tensors (rank 0's only): per message size (log2 bytes), whether
  // the next calls stage them in the heap (0) or use the windows (1), in alternate slots.
  uint8_t staging_choice[2][64];
  // try_empty: where this rank's part lies (offset + 1), or 0 where it had no room, per row.
  uint64_t allocated[2];
  // The per-rank sizes behind calls[row].detail, for the error that names them.
  uint64_t pieces[2][kMaxRanks];
  // Single-copy probe at creation: an address in this rank's private memory holding
  // kMagic, and whether this rank could read (and write) every peer's.
  uint64_t probe_addr;
  uint64_t can_reach_peers;
};

class Heap {
 public:
  // Collective over `g` (every member calls it, in the same order as its other
  // collectives): creates this rank's segment, publishes its name in the group's store,
  // maps every peer's, and unlinks the name once all have mapped it.
  static std::shared_ptr<Heap> create(const comm::Group& g);
  ~Heap();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  const std::string& what() const { return what_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  Control& control(int peer) const { return *reinterpret_cast<Control*>(peers_[peer]); }
  // The scratch window of `peer` for a step of the given parity: scratch_bytes() long.
  char* scratch(int peer, int parity) const { return peers_[peer] + control_bytes_ + parity * scratch_bytes_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  // How much of the window a collective step uses: small enough that a step's data moves
  // between caches rather than through DRAM, large enough that barriers stay rare.
  size_t step_bytes() const { return step_bytes_; }
  char* user(int peer) const { return peers_[peer] + control_bytes_ + 2 * scratch_bytes_; }
  size_t user_bytes() const { return user_bytes_; }
  // After the user heap, every rank's local region (HP_SHM_LOCAL_MIB): memory its peers can
  // reach, allocated by each rank on its own, so at offsets that differ between ranks.
  // Collectives keep their outputs and staged inputs there.
  size_t local_bytes() const { return local_bytes_; }
  // Whether [p, p + bytes) lies in this rank's user heap or local region: offsets from
  // user() into either are valid in every rank's mapping.
  bool holds(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return c >= user(rank_) && c + bytes <= user(rank_) + user_bytes_ + local_bytes_;
  }
  // Whether every rank can read and write every peer's private memory (cross_memory.h),
  // decided together at creation; HP_SHM_SINGLE_COPY=0 turns it off.
  bool single_copy() const { return single_copy_; }

  // The parity of the next collective step. Every rank takes steps in the same order, so
  // a window is written again only two steps later, after a barrier that all readers of
  // its previous contents have passed.
  int next_parity() { return static_cast<int>(steps_++ & 1); }
  int next_exchange() { return static_cast<int>(exchanges_++ & 1); }

  // Rank 0's timings of two ways to run a collective, by message size (log2 bytes):
  // recent seconds per call of each, and how many calls it has timed.
  struct PathTimes {
    double seconds[64][2] = {};
    uint32_t calls[64] = {};
  };
  PathTimes& path_times() { return path_times_; }
  // The slot of Control::staging_choice that the next large all-reduce reads.
  int next_choice_slot() { return static_cast<int>(choices_++ & 1); }

  // Every rank arrives (release), then waits for all others (acquire). Fails naming the
  // ranks that did not arrive within the group's timeout, or at once if one has died; and,
  // the first barrier after announce(), unless every rank announced the same call.
  void barrier(const char* op = "barrier");
  // What this rank's collective call was given, published before its first barrier, which
  // checks it against every peer's (agreement.h). Every call announces and then passes at
  // least one barrier, so that calls pair up one to one.
  void announce(const Call& c);
  void signal(int peer, int slot, uint64_t value, SignalOp op);
  // Waits until this rank's `slot` holds at least `value`; returns what it holds.
  uint64_t wait_signal(int slot, uint64_t value, std::chrono::milliseconds timeout);

  // The user heap: first fit, so ranks that allocate and free in the same order get the
  // same offsets. Returns an offset into user().
  size_t allocate(size_t bytes);
  // The same with its pages backed, so that a full shared-memory file system shows here
  // rather than later as SIGBUS; false, and nothing allocated, where there is no room.
  bool try_allocate(size_t bytes, size_t* offset);
  // The same in the local region (an offset from user() as well).
  bool try_allocate_local(size_t bytes, size_t* offset);
  void release(size_t offset);

  // The heap whose user region (on this rank) holds `p`, or null.
  static std::shared_ptr<Heap> owning(const void* p);

 private:
  Heap() = default;
  void decide_single_copy();  // collective, at the end of create()
  // First fit over a range of offsets from user(); used under alloc_mu_.
  struct Arena {
    std::map<size_t, size_t> free, used;  // offset -> bytes
    bool take(size_t bytes, size_t* offset);
    void give_back(size_t offset);
  };
  bool try_allocate_in(Arena& a, size_t bytes, size_t* offset);
  bool back(size_t offset, size_t bytes);  // populates the pages of a range, under alloc_mu_
  std::vector<int> late_peers(uint64_t epoch) const;
  void check_alive(const char* op) const;
  [[noreturn]] void fail_late(const char* op, const std::vector<int>& late,
                              std::chrono::milliseconds waited) const;

  int rank_ = 0;
  std::vector<int> global_ranks_;
  std::string what_;
  std::chrono::milliseconds timeout_{0};
  size_t control_bytes_ = 0, scratch_bytes_ = 0, step_bytes_ = 0, user_bytes_ = 0, local_bytes_ = 0;
  Segment own_;
  std::vector<Segment> mapped_;  // peers' segments (own_ at our index is left empty)
  std::vector<char*> peers_;     // base of every rank's segment, ours included
  uint64_t epoch_ = 0;
  uint64_t steps_ = 0;
  uint64_t exchanges_ = 0;
  uint64_t choices_ = 0;
  uint64_t calls_ = 0;  // collective calls announced
  int announced_row_ = -1;  // the row the next barrier checks; -1: none
  PathTimes path_times_;
  bool single_copy_ = false;
  uint64_t probe_word_ = 0;  // read (and written back) by peers to test single-copy moves
  std::mutex alloc_mu_;
  Arena symmetric_, local_;
  std::vector<bool> backed_;  // per kBackedChunk of the user heap and local region: populated
  std::weak_ptr<Heap> self_;
};

// The symmetric heap of `g`, created on first use (Heap::create, a collective call: every
// member must reach it at the same point of its sequence of collectives) and kept with the
// group. Throws unless g's ranks are all on one host.
std::shared_ptr<Heap> group_heap(const comm::Group& g);

// Spins briefly, then yields, then naps: ranks may outnumber cores.
class Backoff {
 public:
  void pause();
  std::chrono::steady_clock::duration waited() const { return std::chrono::steady_clock::now() - start_; }

 private:
  uint64_t spins_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace hp::symm
