#include "hp/tensor/memory_stats.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace hp {
namespace {

std::atomic<int64_t> allocated{0};
std::atomic<int64_t> peak{0};

class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) const override {
    auto* held = new Held{inner_->allocate(n), static_cast<int64_t>(n)};
    const int64_t now = allocated.fetch_add(held->bytes) + held->bytes;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
    return c10::DataPtr(held->ptr.get(), held, &release, held->ptr.device());
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // LibTorch 2.x asks allocators to copy; 1.13 does not know the method.
  void copy_data(void* dst, const void* src, std::size_t count) const { std::memcpy(dst, src, count); }

 private:
  struct Held {
    c10::DataPtr ptr;
    int64_t bytes;
  };
  static void release(void* ctx) {
    auto* held = static_cast<Held*>(ctx);
    allocated.fetch_sub(held->bytes);
    delete held;
  }
  c10::Allocator* inner_;
};

}  // namespace

void track_cpu_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
}

int64_t cpu_memory_allocated() { return allocated.load(); }
int64_t cpu_memory_peak() { return peak.load(); }
void reset_cpu_memory_peak() { peak.store(allocated.load()); }

}  // namespace hp
