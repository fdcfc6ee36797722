// Bytes of CPU tensor storage alive now and at the peak: an allocator that counts and
// hands every request to the one it replaces. Process-wide; off until installed, so that
// programs that do not ask for it pay nothing.
#pragma once

#include <cstdint>

namespace hp {

// Installs the counting CPU allocator (idempotent). Storage allocated before is not seen.
void track_cpu_memory();
int64_t cpu_memory_allocated();
int64_t cpu_memory_peak();      // since the last reset
void reset_cpu_memory_peak();   // the peak restarts from what is allocated now

}  // namespace hp
