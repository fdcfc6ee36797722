#include "hp/tensor/memory_stats.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "hp/comm/symm/symm.h"

namespace hp {
namespace {

struct Counters {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
};

Counters cpu, meta;

void count(Counters& c, int64_t delta) {
  const int64_t now = c.allocated.fetch_add(delta) + delta;
  int64_t p = c.peak.load();
  while (now > p && !c.peak.compare_exchange_weak(p, now)) {
  }
}

// Symmetric tensors live in shared memory, outside LibTorch's allocator, and count as CPU.
void count_symmetric(int64_t delta) { count(cpu, delta); }

// Counts what `inner` allocates. With `header`, each allocation starts with a header that
// points at its record, so that the data pointer is the context: c10's raw_allocate (through
// which oneDNN takes its scratch buffers) requires that. Without (meta, whose data pointers
// are null), the record is the context.
class CountingAllocator : public c10::Allocator {
 public:
  CountingAllocator(c10::Allocator* inner, Counters* counters, bool header)
      : inner_(inner), counters_(counters), header_(header) {}

  c10::DataPtr allocate(size_t n) override {
    auto* held = new Held{inner_->allocate(header_ ? n + kHeader : n), static_cast<int64_t>(n), counters_};
    count(*counters_, held->bytes);
    if (!header_) return c10::DataPtr(held->ptr.get(), held, &release, held->ptr.device());
    char* data = static_cast<char*>(held->ptr.get()) + kHeader;
    *reinterpret_cast<Held**>(data - kHeader) = held;
    return c10::DataPtr(data, data, &release_data, held->ptr.device());
  }
  c10::DeleterFnPtr raw_deleter() const override { return header_ ? &release_data : nullptr; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }

 private:
  static constexpr size_t kHeader = 64;  // keeps the inner allocator's 64-byte alignment
  struct Held {
    c10::DataPtr ptr;
    int64_t bytes;
    Counters* counters;
  };
  static void release(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    held->counters->allocated.fetch_sub(held->bytes);
    delete held;
  }
  static void release_data(void* data) { release(*reinterpret_cast<Held**>(static_cast<char*>(data) - kHeader)); }
  c10::Allocator* inner_;
  Counters* counters_;
  bool header_;
};

}  // namespace

void track_cpu_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator(), &cpu, /*header=*/true);
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    symm::set_allocation_observer(&count_symmetric);
  });
}

int64_t cpu_memory_allocated() { return cpu.allocated.load(); }
int64_t cpu_memory_peak() { return cpu.peak.load(); }
void reset_cpu_memory_peak() { cpu.peak.store(cpu.allocated.load()); }

void track_meta_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetAllocator(c10::DeviceType::Meta), &meta, /*header=*/false);
    c10::SetAllocator(c10::DeviceType::Meta, &counting, /*priority=*/100);
  });
}

int64_t meta_memory_allocated() { return meta.allocated.load(); }
int64_t meta_memory_peak() { return meta.peak.load(); }
void reset_meta_memory_peak() { meta.peak.store(meta.allocated.load()); }

}  // namespace hp
