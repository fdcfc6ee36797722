#include "hp/comm/symm/staging_choice.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace hp::symm {

StagingChoice::StagingChoice(Heap& h, size_t bytes)
    : h_(h), bucket_(std::min(63, 63 - __builtin_clzll(bytes))), start_(std::chrono::steady_clock::now()) {
  const char* v = std::getenv("HP_SHM_STAGING");  // read each time: tests and benchmarks set it
  forced_ = v && std::string(v) == "0" ? kWindows : v && std::string(v) == "1" ? kStaged : -1;
  const int slot = h.next_choice_slot();
  way_ = forced_ >= 0 ? forced_ : h.control(0).staging_choice[slot][bucket_];
  // Rank 0 may write the other slot now: every rank read it before the last call's end.
  if (h.rank() == 0 && forced_ < 0) publish(slot ^ 1);
}

void StagingChoice::took(Way way) {
  if (h_.rank() != 0 || forced_ >= 0 || way != way_) return;
  auto& t = h_.path_times();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // A running minimum that creeps up 5% a call: a slow first call (pages touched for the
  // first time) is forgotten at the next good one, a lasting slowdown shows in ~15 calls.
  double& best = t.seconds[bucket_][way];
  best = best == 0 ? s : std::min(s, best * 1.05);
  ++t.calls[bucket_];
}

void StagingChoice::publish(int slot) {
  const auto& t = h_.path_times();
  for (int b = 0; b < 64; ++b) {
    const double staged = t.seconds[b][kStaged], windows = t.seconds[b][kWindows];
    int way = windows > 0 && windows < staged ? kWindows : kStaged;
    if (t.calls[b] < 4) way = static_cast<int>(t.calls[b] % 2);  // each way twice, first
    else if (t.calls[b] % 16 == 15) way = 1 - way;
    h_.control(0).staging_choice[slot][b] = static_cast<uint8_t>(way);
  }
}

}  // namespace hp::symm
