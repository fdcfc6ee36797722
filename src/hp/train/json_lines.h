// Reading the trainer's JSON-lines files (metrics, monitor): every non-blank line through
// `parse(line, path, line_number)`, errors naming the file as `what`.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "hp/base/error.h"

namespace hp::train {

template <typename Parse>
auto read_json_lines(const std::string& path, const std::string& what, Parse parse)
    -> std::vector<decltype(parse(std::string(), path, int64_t{}))> {
  std::ifstream in(path);
  HP_CHECK(in.is_open()) << "cannot open the " << what << " '" << path << "'";
  std::vector<decltype(parse(std::string(), path, int64_t{}))> records;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n)
    if (line.find_first_not_of(" \t\r") != std::string::npos) records.push_back(parse(line, path, n));
  HP_CHECK(in.eof()) << "failed reading the " << what << " '" << path << "'";
  return records;
}

}  // namespace hp::train
