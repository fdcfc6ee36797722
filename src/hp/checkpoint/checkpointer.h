// Checkpoints of one run under a root directory: root/step-N, the last `keep` kept.
// save() with async = true copies this rank's chunks into CPU buffers (reused from save to
// save) and returns; a background thread writes and publishes them while training goes on.
// With defer_snapshot the copy too runs on that thread, beside the next forward and
// backward, which only read the state: call wait_for_snapshot() before anything changes a
// saved tensor (the optimizer step). A tensor that changes before its copy is taken fails
// that save (its version counter tells, when the copy is taken and again when the files
// are written), so a missing call never publishes a torn checkpoint. A save waits for the
// previous one first; wait() and the destructor wait too.
#pragma once

#include <cstdint>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hp/checkpoint/state.h"

namespace hp::checkpoint {

struct CheckpointOptions {
  std::string dir;
  int64_t keep = 2;   // published checkpoints kept; 0 = all
  bool async = false;
  bool defer_snapshot = false;  // with async: snapshot on the writer thread (see above)
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointOptions options);
  ~Checkpointer();  // waits; a background error is reported on stderr
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Every rank calls it with the same step and the same tensor names.
  void save(int64_t step, const State& state);
  // Until the last save is published; rethrows its error.
  void wait();
  // Until the last save's snapshot is taken (at once when it was taken in save()); after
  // it the saved tensors may change. A snapshot that failed is reported by wait().
  void wait_for_snapshot();

  std::optional<int64_t> latest_step() const;
  // Loads the latest intact checkpoint into `state` and returns its step; none if there is
  // none. Collective over the world: a checkpoint that fails verification on any rank
  // (metadata, headers, data checksums) is skipped by all, which fall back to the next
  // older one and say so on stderr; an error when every checkpoint fails.
  std::optional<int64_t> load_latest(State& state) const;

  const CheckpointOptions& options() const { return options_; }

 private:
  CheckpointOptions options_;
  std::thread writer_;
  std::exception_ptr error_;
  std::vector<at::Tensor> buffers_;  // snapshot of each piece, reused when shapes repeat
  std::mutex mu_;
  std::condition_variable snapshot_cv_;
  bool snapshot_taken_ = true;
  // A deferred save's live pieces and their versions at the first wait_for_snapshot()
  // after it (empty: not waited for): a change still being made while the copy was taken
  // bumps its version only when done, so the writer checks the versions again, against
  // those of save(), once the files are written.
  std::vector<at::Tensor> live_;
  std::vector<int64_t> versions_at_wait_;
};

}  // namespace hp::checkpoint
