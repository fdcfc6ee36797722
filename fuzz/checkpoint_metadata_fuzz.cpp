// Checkpoint metadata: any text is refused with hp::Error or parsed into metadata whose
// every chunk lies inside its tensor and its file, and which writes back to the same
// metadata. Inputs that are JSON get a valid checksum first, so the fuzzer reaches the
// validation behind it.
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "hp/base/error.h"
#include "hp/checkpoint/format.h"
#include "hp/checkpoint/validate.h"

namespace {

// The text with its "xxh3_64" set to what metadata_from_json computes (format.cpp).
std::string sealed(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return text;
  j.erase("xxh3_64");
  const std::string body = j.dump();
  j["xxh3_64"] = hp::checkpoint::hex(hp::checkpoint::checksum(body.data(), body.size()));
  return j.dump();
}

void check_invariants(const hp::checkpoint::Metadata& m) {
  for (const auto& [name, t] : m.tensors)
    for (const auto& c : t.chunks) {
      if (c.offsets.size() != t.shape.size() || c.sizes.size() != t.shape.size()) std::abort();
      for (size_t d = 0; d < t.shape.size(); ++d)
        if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] + c.sizes[d] > t.shape[d]) std::abort();
      if (!hp::checkpoint::is_plain_file_name(c.file) || !m.files.count(c.file)) std::abort();
      if (c.begin < 8 || c.begin > c.end || c.end > m.files.at(c.file).bytes) std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = sealed(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const hp::checkpoint::Metadata m = hp::checkpoint::metadata_from_json(text, "fuzz");
    check_invariants(m);
    const hp::checkpoint::Metadata again = hp::checkpoint::metadata_from_json(hp::checkpoint::to_json(m), "again");
    if (hp::checkpoint::to_json(again) != hp::checkpoint::to_json(m)) std::abort();
  } catch (const hp::Error&) {
  }
  return 0;
}
