// The large copies of the shared-memory collectives.
#pragma once

#include <cstddef>

namespace hp::symm {

// From this size, a copy writes with non-temporal stores (on x86): it does not read the
// destination's lines first, nor evict the caches for data that would not stay there.
// glibc's memcpy switches to such stores only at 3/4 of the shared cache per thread (127
// MiB on the machine of docs/performance.md). The copies of a collective step through a
// window are smaller and stay plain: their results are read again soon, and fencing every
// step made them slower.
constexpr size_t kStreamBytes = size_t(1) << 20;

// memcpy, streamed from kStreamBytes. Streamed stores are fenced before it returns, so
// the next release store (a barrier, a signal) publishes them like any other write.
void copy_large(void* dst, const void* src, size_t bytes);

}  // namespace hp::symm
