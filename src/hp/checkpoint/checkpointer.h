// Checkpoints of one run under a root directory: root/step-N, the last `keep` kept.
// save() with async = true copies this rank's chunks into CPU buffers (reused from save to
// save) and returns; a background thread writes and publishes them while training goes on.
// A save waits for the previous one first; wait() and the destructor wait too.
#pragma once

#include <cstdint>
#include <exception>
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

  std::optional<int64_t> latest_step() const;
  // Loads the latest published checkpoint into `state`; returns its step, none if there is none.
  std::optional<int64_t> load_latest(State& state) const;

  const CheckpointOptions& options() const { return options_; }

 private:
  CheckpointOptions options_;
  std::thread writer_;
  std::exception_ptr error_;
  std::vector<at::Tensor> buffers_;  // snapshot of each piece, reused when shapes repeat
};

}  // namespace hp::checkpoint
