#include "hp/train/corpus.h"

#include <fstream>
#include <sstream>

#include "hp/base/error.h"

namespace hp::train {

namespace {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

std::string read_file(const std::string& path, const char* hint) {
  std::ifstream in(path, std::ios::binary);
  HP_CHECK(in) << "cannot open text file " << path << hint;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Drops the "%" lines that separate fortunes so the model never learns them.
std::string strip_separators(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  bool gap = false;
  while (std::getline(in, line)) {
    if (line == "%") {
      gap = !out.empty();
      continue;
    }
    if (gap) out += "\n";
    gap = false;
    out += line;
    out += "\n";
  }
  return out;
}

}  // namespace

std::vector<std::string> fortunes_files() {
  std::vector<std::string> files;
  for (const char* name : {"fortunes", "literature", "riddles"})
    files.push_back(std::string(kFortunesDir) + "/" + name);
  return files;
}

std::string read_text(const std::string& path) {
  if (!path.empty()) {
    auto text = read_file(path, "");
    HP_CHECK(!text.empty()) << "text file " << path << " is empty";
    return text;
  }
  std::string text;
  for (const auto& f : fortunes_files()) {
    if (!text.empty()) text += "\n";
    text += strip_separators(
        read_file(f, " (the default corpus: install Debian's fortunes-min, or set [data] path)"));
  }
  return text;
}

}  // namespace hp::train
