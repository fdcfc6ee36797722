// Byte-level tokenizer: token = byte value (0..255). No vocabulary file, no
// unknown tokens, and decode(encode(s)) == s for any bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hp::train {

constexpr int64_t kByteVocab = 256;

std::vector<int64_t> encode(const std::string& text);

// Throws on a token outside 0..255, naming its index and value.
std::string decode(const std::vector<int64_t>& tokens);

}  // namespace hp::train
