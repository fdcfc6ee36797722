#include "hp/comm/symm/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hp::symm {
namespace {

#if defined(__SSE2__)
void stream(char* d, const char* s, size_t bytes) {
  const size_t head = std::min(bytes, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);  // then whole, aligned 64-byte lines
  d += head, s += head, bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();  // streamed stores are weakly ordered: order them before the next store
  std::memcpy(d + i, s + i, bytes - i);
}
#endif

}  // namespace

void copy_large(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;  // an empty tensor's pointer may be null, which memcpy forbids
#if defined(__SSE2__)
  if (bytes >= kStreamBytes)
    return stream(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace hp::symm
