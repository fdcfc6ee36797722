// Training text: a file, or by default the fortunes corpus (Debian's
// fortunes-min), which every dev and CI machine has after scripts/setup.
#pragma once

#include <string>
#include <vector>

namespace hp::train {

// The fortunes files read when no path is given.
std::vector<std::string> fortunes_files();

// The text of `path`, or of the fortunes corpus when `path` is empty. Fortune
// files' "%" separator lines are dropped; entries are joined by a blank line.
// A missing or empty file is an error naming it.
std::string read_text(const std::string& path);

}  // namespace hp::train
