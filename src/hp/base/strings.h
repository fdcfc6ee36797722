// Small string helpers shared by every layer.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace hp {

// "[2, 3, 4]" for any iterable of printable values.
template <typename Seq>
std::string to_string_list(const Seq& seq, const char* open = "[", const char* close = "]") {
  std::ostringstream os;
  os << open;
  bool first = true;
  for (const auto& v : seq) {
    if (!first) os << ", ";
    os << v;
    first = false;
  }
  os << close;
  return os.str();
}

std::vector<std::string> split(const std::string& s, char sep);
std::string trim(const std::string& s);

}  // namespace hp
