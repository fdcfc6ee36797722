// The counting CPU allocator sees storage come and go and keeps the peak.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "hp/comm/local_ranks.h"
#include "hp/comm/symm/symm.h"
#include "hp/comm/world.h"
#include "hp/tensor/memory_stats.h"

TEST(MemoryStats, CountsLiveStorageAndPeak) {
  hp::track_cpu_memory();
  const int64_t before = hp::cpu_memory_allocated();
  hp::reset_cpu_memory_peak();
  {
    at::Tensor a = at::empty({1 << 18}, at::kFloat);  // 1 MiB
    EXPECT_EQ(hp::cpu_memory_allocated() - before, 1 << 20);
    at::Tensor b = at::ones({1 << 17}, at::kDouble);  // 1 MiB more
    EXPECT_EQ(hp::cpu_memory_allocated() - before, 2 << 20);
    EXPECT_DOUBLE_EQ(b.sum().item<double>(), double(1 << 17));  // the memory is usable
  }
  EXPECT_EQ(hp::cpu_memory_allocated(), before);
  EXPECT_GE(hp::cpu_memory_peak() - before, 2 << 20);
  hp::reset_cpu_memory_peak();
  EXPECT_EQ(hp::cpu_memory_peak(), before);
}

// Raw allocations (oneDNN's scratch buffers take them) work while counting, and count.
TEST(MemoryStats, RawAllocationsWork) {
  hp::track_cpu_memory();
  const int64_t before = hp::cpu_memory_allocated();
  c10::Allocator* a = c10::GetCPUAllocator();
  void* p = a->raw_allocate(1 << 20);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 1 << 20);
  EXPECT_EQ(hp::cpu_memory_allocated() - before, 1 << 20);
  a->raw_deallocate(p);
  EXPECT_EQ(hp::cpu_memory_allocated(), before);
}

// Symmetric tensors live in shared memory, not in LibTorch's allocator, and count too.
TEST(MemoryStats, CountsSymmetricTensors) {
  hp::track_cpu_memory();
  hp::comm::run_local_ranks(2, [](int rank) {
    auto g = hp::comm::current_world()->world_group();
    hp::symm::barrier(*g);  // creates the heap on both ranks first
    const int64_t before = hp::cpu_memory_allocated();
    hp::symm::barrier(*g);
    {
      at::Tensor s = hp::symm::empty({1 << 18}, at::kFloat, *g);  // 1 MiB on each rank
      hp::symm::barrier(*g);
      if (rank == 0) EXPECT_EQ(hp::cpu_memory_allocated() - before, 2 << 20);
      hp::symm::barrier(*g);
    }
    hp::symm::barrier(*g);
    if (rank == 0) EXPECT_EQ(hp::cpu_memory_allocated(), before);
  });
}
