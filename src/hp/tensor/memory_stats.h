// Bytes of tensor storage alive now and at the peak: an allocator that counts and hands
// every request to the one it replaces. Process-wide; off until installed, so that
// programs that do not ask for it pay nothing.
//
// CPU: real bytes. Meta: the bytes the storage would hold (meta tensors have no data, but
// their storages are sized and freed like real ones), so a dry-run on meta tensors reports
// the high-water mark the same code reaches on a device.
#pragma once

#include <cstdint>

namespace hp {

// Installs the counting CPU allocator (idempotent). Storage allocated before is not seen.
// Tensors in a symmetric heap (hp::symm::empty) count as CPU storage too.
void track_cpu_memory();
int64_t cpu_memory_allocated();
int64_t cpu_memory_peak();      // since the last reset
void reset_cpu_memory_peak();   // the peak restarts from what is allocated now

// The same for meta storage.
void track_meta_memory();
int64_t meta_memory_allocated();
int64_t meta_memory_peak();
void reset_meta_memory_peak();

}  // namespace hp
