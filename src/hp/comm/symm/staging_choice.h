// The one tuned decision of the shared-memory collectives: whether a large all-reduce of
// a private tensor is staged in the heap (one copy, then read in place: few barriers, long
// streamed copies) or goes through the windows (one barrier per step, small copies that
// stay in cache). Which wins depends on where the ranks run: on cores apart staging does,
// on two threads of one core sharing a cache the windows do, and a virtual machine's
// placement can change under a run. So the choice is timed per message size, by rank 0,
// and published to every rank. HP_SHM_STAGING=1 always stages, 0 never.
#pragma once

#include <chrono>
#include <cstddef>

#include "hp/comm/symm/heap.h"

namespace hp::symm {

// Rank 0 times the large all-reduces of private tensors and publishes, per message size,
// whether the next ones stage or take the windows: each way twice at first, then the
// faster so far, but every 16th call the other, so that a change of placement shows.
// Every rank reads the choice rank 0 wrote during the previous such call (two slots in
// turn), so all take the same way; a rank that took the other would cost time, not bits.
class StagingChoice {
 public:
  enum Way { kStaged = 0, kWindows = 1 };

  // Collective: every rank calls it for the same all-reduces (by size), in order.
  StagingChoice(Heap& h, size_t bytes);
  bool stage() const { return way_ == kStaged; }
  // Rank 0, when the call went the chosen way with its own tensor private: its time counts.
  void took(Way way);

 private:
  void publish(int slot);

  Heap& h_;
  int bucket_;
  std::chrono::steady_clock::time_point start_;
  int forced_ = -1, way_ = kStaged;
};

}  // namespace hp::symm
