// Batches of (inputs, targets) from a token stream, sliced for data parallelism.
//
// Step k's global batch is a pure function of (tokens, seq, global_batch, seed, k):
// sample i of it starts at a position drawn by a counter-based hash of
// (seed, k, i). A dp rank computes only its rows, and the rows of all ranks,
// concatenated in rank order, are exactly what one process (dp_size = 1) gets —
// so a distributed run can be compared with a single-process run, and a resumed
// run (seek) sees the same data as an uninterrupted one.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "hp/train/corpus.h"
#include "hp/train/tokenizer.h"

namespace hp::train {

struct Batch {
  at::Tensor inputs;   // int64 [local_batch, seq]
  at::Tensor targets;  // int64 [local_batch, seq]: inputs shifted left by one token
  int64_t step = 0;    // which global step this is a slice of
};

class DataLoader {
 public:
  // Errors: global_batch not divisible by dp_size, dp_rank out of range, fewer
  // than seq + 1 tokens.
  DataLoader(std::vector<int64_t> tokens, int64_t seq, int64_t global_batch, int64_t dp_rank = 0,
             int64_t dp_size = 1, uint64_t seed = 0);

  // From now on each sequence of a batch is this cp rank's share of it (of cp_size), in the
  // order of hp/parallel/context_parallel_layout.h (head and tail with load_balance), the
  // targets taken at the same positions as the inputs.
  void shard_sequence(int64_t cp_rank, int64_t cp_size, bool load_balance = true);
  // The same over several cp mesh dims of `cp_sizes` (outer first; hybrid: the ring's, then
  // Ulysses'), `cp_rank` numbered with the outer dim major.
  void shard_sequence(int64_t cp_rank, const std::vector<int64_t>& cp_sizes, bool load_balance = true);
  // Each sequence whole but in the cp layout's order, every rank's share after the other
  // (pipeline stages take their shares themselves).
  void order_sequence(const std::vector<int64_t>& cp_sizes, bool load_balance = true);

  // This rank's slice of the current step's global batch; advances one step.
  Batch next();
  // This rank's slice of step `step`'s batch; does not move the position.
  Batch batch(int64_t step) const;

  int64_t position() const { return step_; }  // the step next() returns
  void seek(int64_t step);

  int64_t seq() const { return seq_; }
  int64_t global_batch() const { return global_batch_; }
  int64_t local_batch() const { return global_batch_ / dp_size_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_->size()); }

  // Start of sample `index` (0 <= index < global_batch) of step `step`'s global batch.
  int64_t window_start(int64_t step, int64_t index) const;

 private:
  std::shared_ptr<const std::vector<int64_t>> tokens_;
  int64_t seq_, global_batch_, dp_rank_, dp_size_;
  uint64_t seed_;
  int64_t step_ = 0;
  at::Tensor positions_;  // this cp rank's positions of each sequence; undefined: all
};

}  // namespace hp::train
