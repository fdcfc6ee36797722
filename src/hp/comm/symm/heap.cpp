#include "hp/comm/symm/heap.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/group.h"
#include "hp/comm/symm/cross_memory.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif

namespace hp::symm {
namespace {

constexpr uint64_t kMagic = 0x68702d73796d6d31;  // "hp-symm1"
constexpr size_t kPage = 4096;
constexpr size_t kBackedChunk = 64 << 10;  // user heap and local region pages are backed in chunks of this

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// `name` as a positive count of 2^shift bytes, else `fallback` of them.
size_t bytes_from_env(const char* name, size_t fallback, int shift) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback << shift;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  HP_CHECK(end && *end == '\0' && x >= 1) << name << " must be a positive integer, got '" << v << "'";
  return static_cast<size_t>(x) << shift;
}

// Single copy (cross-memory attach) unless HP_SHM_SINGLE_COPY=0.
bool single_copy_wanted() {
  const char* v = std::getenv("HP_SHM_SINGLE_COPY");
  return !(v && std::string(v) == "0");
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// User region start -> heap. Never destroyed: heaps held by the process-wide world die
// during static destruction, in no fixed order with this file's statics.
struct Registry {
  std::mutex mu;
  std::map<const char*, std::weak_ptr<Heap>> heaps;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void Backoff::pause() {
  ++spins_;
  if (spins_ < 16) return cpu_relax();
  if (waited() < std::chrono::milliseconds(2)) return std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::microseconds(50));
}

std::shared_ptr<Heap> Heap::create(const comm::Group& g) {
  HP_CHECK(g.size() <= kMaxRanks) << "symmetric heap on " << g.describe() << ": at most " << kMaxRanks
                                  << " ranks per group";
  std::shared_ptr<Heap> h(new Heap());
  h->self_ = h;
  h->rank_ = g.rank();
  h->global_ranks_ = g.ranks();
  h->what_ = g.describe();
  h->timeout_ = g.timeout();
  h->control_bytes_ = round_up(sizeof(Control), kPage);
  // Virtual sizes: tmpfs only backs the pages that are touched.
  h->scratch_bytes_ = bytes_from_env("HP_SHM_SCRATCH_MIB", 8, 20);
  h->step_bytes_ = std::min(h->scratch_bytes_, bytes_from_env("HP_SHM_STEP_KIB", 256, 10) / 64 * 64);
  HP_CHECK(h->step_bytes_ >= 64 * size_t(g.size())) << "HP_SHM_STEP_KIB is too small for " << g.size() << " ranks";
  h->user_bytes_ = bytes_from_env("HP_SYMM_HEAP_MIB", 64, 20);
  h->local_bytes_ = bytes_from_env("HP_SHM_LOCAL_MIB", 64, 20);
  const size_t total = h->control_bytes_ + 2 * h->scratch_bytes_ + h->user_bytes_ + h->local_bytes_;

  // Before the barrier after which peers probe this process.
  if (single_copy_wanted()) allow_peer_access();
  h->own_ = Segment::create(total, std::to_string(g.rank()));
  auto* ctl = reinterpret_cast<Control*>(h->own_.data());
  ctl->magic = kMagic;
  ctl->pid = ::getpid();
  h->probe_word_ = kMagic;
  ctl->probe_addr = reinterpret_cast<uint64_t>(&h->probe_word_);

  // Exchange names through the group's store.
  c10d::Store& store = *g.store();
  const std::string key = "hp/symm/name/";
  const std::string mine = h->own_.name();
  store.set(key + std::to_string(g.rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < g.size(); ++r) keys.push_back(key + std::to_string(r));
  try {
    store.wait(keys, g.timeout());
  } catch (const std::exception& e) {
    std::vector<int> missing;
    for (int r = 0; r < g.size(); ++r)
      if (!store.check({keys[r]})) missing.push_back(g.global_rank(r));
    HP_FAIL() << "symmetric heap on " << g.describe() << ": ranks " << to_string_list(missing)
              << " did not publish their segments within " << g.timeout().count() << " ms: " << e.what();
  }
  h->mapped_.resize(g.size());
  h->peers_.resize(g.size());
  for (int r = 0; r < g.size(); ++r) {
    if (r == g.rank()) {
      h->peers_[r] = h->own_.data();
      continue;
    }
    std::vector<uint8_t> v = store.get(keys[r]);
    h->mapped_[r] = Segment::open(std::string(v.begin(), v.end()), total);
    h->peers_[r] = h->mapped_[r].data();
    HP_CHECK(h->control(r).magic == kMagic)
        << "symmetric heap on " << g.describe() << ": rank " << g.global_rank(r)
        << "'s segment is not initialised";
  }
  // Once everyone has mapped every segment, no name is needed any more.
  h->barrier("symmetric heap creation");
  h->own_.unlink();
  h->decide_single_copy();

  h->symmetric_.free[0] = h->user_bytes_;
  h->local_.free[h->user_bytes_] = h->local_bytes_;
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().heaps[h->user(h->rank_)] = h;
  return h;
}

void Heap::decide_single_copy() {
  bool ok = single_copy_wanted();
  for (int r = 0; r < size() && ok; ++r) {
    // Read the peer's word, and write it back unchanged: broadcast writes into peers too.
    uint64_t word = 0;
    ok = read_peer(control(r).pid, control(r).probe_addr, &word, sizeof word) && word == kMagic &&
         write_peer(control(r).pid, control(r).probe_addr, &word, sizeof word);
  }
  control(rank_).can_reach_peers = ok;
  barrier("single-copy probe");
  single_copy_ = true;
  for (int r = 0; r < size(); ++r) single_copy_ = single_copy_ && control(r).can_reach_peers;
}

Heap::~Heap() {
  std::lock_guard<std::mutex> lock(registry().mu);
  if (!peers_.empty()) registry().heaps.erase(user(rank_));
}

std::shared_ptr<Heap> Heap::owning(const void* p) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(registry().mu);
  auto it = registry().heaps.upper_bound(c);
  if (it == registry().heaps.begin()) return nullptr;
  --it;
  auto h = it->second.lock();
  if (!h || c >= it->first + h->user_bytes_) return nullptr;
  return h;
}

std::vector<int> Heap::late_peers(uint64_t epoch) const {
  std::vector<int> late;
  for (int r = 0; r < size(); ++r)
    if (control(r).barrier.load(std::memory_order_acquire) < epoch) late.push_back(global_ranks_[r]);
  return late;
}

void Heap::check_alive(const char* op) const {
  for (int r = 0; r < size(); ++r) {
    const pid_t pid = static_cast<pid_t>(control(r).pid);
    HP_CHECK(!(::kill(pid, 0) != 0 && errno == ESRCH))
        << op << " on " << what_ << ": rank " << global_ranks_[r] << " (pid " << pid << ") has died";
  }
}

void Heap::fail_late(const char* op, const std::vector<int>& late, std::chrono::milliseconds waited) const {
  HP_FAIL() << op << " on " << what_ << " timed out after " << waited.count() << " ms (timeout "
            << timeout_.count() << " ms, HP_TIMEOUT_S): ranks " << to_string_list(late)
            << " did not arrive";
  std::abort();  // not reached: HP_FAIL throws
}

void Heap::barrier(const char* op) {
  const uint64_t epoch = ++epoch_;
  control(rank_).barrier.store(epoch, std::memory_order_release);
  Backoff backoff;
  auto last_check = std::chrono::steady_clock::now();
  for (int r = 0; r < size(); ++r) {
    // A peer is at most one barrier ahead (it needs our arrival to pass this one).
    while (control(r).barrier.load(std::memory_order_acquire) < epoch) {
      backoff.pause();
      const auto now = std::chrono::steady_clock::now();
      if (now - last_check < std::chrono::milliseconds(20)) continue;
      last_check = now;
      check_alive(op);
      if (backoff.waited() > timeout_)
        fail_late(op, late_peers(epoch),
                  std::chrono::duration_cast<std::chrono::milliseconds>(backoff.waited()));
    }
  }
  if (announced_row_ >= 0) {
    const int row = announced_row_;
    announced_row_ = -1;
    try {
      check_agreement(*this, row, op);
    } catch (...) {
      // Every rank fails here alike. One barrier more, so that no rank announces its next
      // call before all have read this one's words; then all count steps and calls from
      // zero again, in step whatever each had counted in the calls that differed.
      try {
        barrier(op);
      } catch (...) {  // a peer died meanwhile: the difference is still the news
      }
      steps_ = exchanges_ = choices_ = calls_ = 0;
      throw;
    }
  }
}

void Heap::announce(const Call& c) {
  // Rows alternate: a peer rewrites this one only in the call after next, which it enters
  // after the next call's first barrier, which waits for this rank to have checked it.
  const int row = static_cast<int>(calls_ & 1);
  Control& mine = control(rank_);
  mine.calls[row] = c.words;
  mine.calls[row].head |= (calls_++ & 0xffffffff) << 32;
  if (c.pieces) std::copy(c.pieces, c.pieces + size(), mine.pieces[row]);
  announced_row_ = row;
}

void Heap::signal(int peer, int slot, uint64_t value, SignalOp op) {
  HP_CHECK(peer >= 0 && peer < size()) << "signal on " << what_ << ": peer " << peer << " is outside the group";
  HP_CHECK(slot >= 0 && slot < kSignalSlots)
      << "signal on " << what_ << ": slot " << slot << " outside [0, " << kSignalSlots << ")";
  auto& word = control(peer).signals[slot];
  if (op == SignalOp::Set) word.store(value, std::memory_order_release);
  else word.fetch_add(value, std::memory_order_acq_rel);
}

uint64_t Heap::wait_signal(int slot, uint64_t value, std::chrono::milliseconds timeout) {
  HP_CHECK(slot >= 0 && slot < kSignalSlots)
      << "wait_signal on " << what_ << ": slot " << slot << " outside [0, " << kSignalSlots << ")";
  auto& word = control(rank_).signals[slot];
  Backoff backoff;
  auto last_check = std::chrono::steady_clock::now();
  for (;;) {
    const uint64_t v = word.load(std::memory_order_acquire);
    if (v >= value) return v;
    backoff.pause();
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check < std::chrono::milliseconds(20)) continue;
    last_check = now;
    check_alive("wait_signal");
    HP_CHECK(backoff.waited() <= timeout)
        << "wait_signal on " << what_ << " (rank " << global_ranks_[rank_] << "): slot " << slot
        << " still holds " << v << " after " << timeout.count() << " ms, waiting for " << value;
  }
}

size_t Heap::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  size_t off = 0;
  if (symmetric_.take(bytes, &off)) return off;
  HP_FAIL() << "symmetric heap on " << what_ << " is full: cannot allocate " << bytes << " bytes of "
            << user_bytes_ << " (raise HP_SYMM_HEAP_MIB)";
  return 0;
}

bool Heap::try_allocate(size_t bytes, size_t* offset) { return try_allocate_in(symmetric_, bytes, offset); }

bool Heap::try_allocate_local(size_t bytes, size_t* offset) { return try_allocate_in(local_, bytes, offset); }

bool Heap::try_allocate_in(Arena& a, size_t bytes, size_t* offset) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  if (!a.take(bytes, offset)) return false;
  if (back(*offset, bytes)) return true;
  a.give_back(*offset);
  return false;
}

void Heap::release(size_t offset) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  (offset < user_bytes_ ? symmetric_ : local_).give_back(offset);
}

bool Heap::Arena::take(size_t bytes, size_t* offset) {
  bytes = round_up(std::max<size_t>(bytes, 1), 64);
  for (auto it = free.begin(); it != free.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t off = it->first, left = it->second - bytes;
    free.erase(it);
    if (left) free[off + bytes] = left;
    used[off] = bytes;
    *offset = off;
    return true;
  }
  return false;
}

void Heap::Arena::give_back(size_t offset) {
  auto u = used.find(offset);
  if (u == used.end()) return;
  size_t off = offset, bytes = u->second;
  used.erase(u);
  auto next = free.find(off + bytes);
  if (next != free.end()) bytes += next->second, free.erase(next);
  auto prev = free.lower_bound(off);
  if (prev != free.begin()) {
    --prev;
    if (prev->first + prev->second == off) off = prev->first, bytes += prev->second, free.erase(prev);
  }
  free[off] = bytes;
}

// Populating pages already there still walks them (about 1 ms per 64 MiB here), so each
// chunk is populated once: shared memory keeps its pages while the segment lives.
bool Heap::back(size_t offset, size_t bytes) {
  const size_t region = user_bytes_ + local_bytes_;
  if (backed_.empty()) backed_.assign((region + kBackedChunk - 1) / kBackedChunk, false);
  for (size_t c = offset / kBackedChunk; c * kBackedChunk < offset + bytes; ++c) {
    if (backed_[c]) continue;
    const size_t len = std::min(kBackedChunk, region - c * kBackedChunk);
    if (::madvise(user(rank_) + c * kBackedChunk, len, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) return false;
    backed_[c] = true;  // EINVAL: a kernel before 5.14 cannot tell; pages come at first use
  }
  return true;
}

std::shared_ptr<Heap> group_heap(const comm::Group& g) {
  HP_CHECK(g.on_one_host()) << "symmetric heap on " << g.describe() << ": the group's ranks are not all on one host";
  return g.transport_state<Heap>([&g] { return Heap::create(g); });
}

}  // namespace hp::symm
