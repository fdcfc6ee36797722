// Safetensors headers (files from elsewhere, such as Hugging Face's): any text is refused
// with hp::Error or gives tensors whose bytes lie inside the file and hold exactly their
// elements.
#include <cstdlib>
#include <string>

#include "hp/base/error.h"
#include "hp/checkpoint/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first two bytes choose the file's size beyond its header.
  const int64_t data_bytes = data[0] | (data[1] << 8);
  const std::string header(reinterpret_cast<const char*>(data) + 2, size - 2);
  const int64_t header_bytes = 8 + static_cast<int64_t>(header.size());
  try {
    for (const auto& e : hp::checkpoint::parse_safetensors_header(header, header_bytes, header_bytes + data_bytes, "fuzz")) {
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      if (e.begin < header_bytes || e.begin > e.end || e.end > header_bytes + data_bytes) std::abort();
      if (e.end - e.begin != numel * hp::checkpoint::dtype_size(e.dtype)) std::abort();
    }
  } catch (const hp::Error&) {
  }
  return 0;
}
