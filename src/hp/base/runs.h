// Runs of alike neighbours in a sequence, for work done once per run (one collective for
// every layer whose tensors are laid out alike).
#pragma once

#include <cstddef>

namespace hp {

// body(first, end) for each maximal run [first, end) of [0, n) whose members are all
// alike(first, i).
template <typename Alike, typename Body>
void for_each_run(size_t n, Alike alike, Body body) {
  for (size_t first = 0; first < n;) {
    size_t end = first + 1;
    while (end < n && alike(first, end)) ++end;
    body(first, end);
    first = end;
  }
}

}  // namespace hp
