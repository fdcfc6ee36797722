#include "hp/train/tokenizer.h"

#include "hp/base/error.h"

namespace hp::train {

std::vector<int64_t> encode(const std::string& text) {
  std::vector<int64_t> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(c);
  return out;
}

std::string decode(const std::vector<int64_t>& tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    HP_CHECK(tokens[i] >= 0 && tokens[i] < kByteVocab)
        << "decode: token[" << i << "] = " << tokens[i] << " is not a byte (0.." << kByteVocab - 1
        << ")";
    out.push_back(static_cast<char>(static_cast<unsigned char>(tokens[i])));
  }
  return out;
}

}  // namespace hp::train
