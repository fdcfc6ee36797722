#include "hp/train/data.h"

#include <cstring>

#include "hp/base/error.h"
#include "hp/parallel/context_parallel_layout.h"

namespace hp::train {

namespace {

// splitmix64's finaliser: a strong 64-bit mix, so nearby counters give
// unrelated outputs. Our own, to stay clear of LibTorch's global RNG state.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

DataLoader::DataLoader(std::vector<int64_t> tokens, int64_t seq, int64_t global_batch,
                       int64_t dp_rank, int64_t dp_size, uint64_t seed)
    : tokens_(std::make_shared<const std::vector<int64_t>>(std::move(tokens))),
      seq_(seq),
      global_batch_(global_batch),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      seed_(seed) {
  HP_CHECK(seq >= 1) << "DataLoader: seq = " << seq << " must be >= 1";
  HP_CHECK(global_batch >= 1) << "DataLoader: global batch = " << global_batch << " must be >= 1";
  HP_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size)
      << "DataLoader: dp rank " << dp_rank << " is not in [0, dp size " << dp_size << ")";
  HP_CHECK(global_batch % dp_size == 0) << "DataLoader: global batch " << global_batch
                                        << " is not divisible by dp size " << dp_size;
  HP_CHECK(num_tokens() >= seq + 1) << "DataLoader: corpus has " << num_tokens()
                                    << " tokens, needs at least seq + 1 = " << seq + 1;
}

int64_t DataLoader::window_start(int64_t step, int64_t index) const {
  uint64_t h = mix(mix(seed_) ^ mix(static_cast<uint64_t>(step) * global_batch_ + index));
  // Windows [start, start + seq] must fit: start in [0, n - seq). Multiply-shift
  // maps h onto that range without a division and with negligible bias.
  uint64_t windows = static_cast<uint64_t>(num_tokens() - seq_);
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * windows) >> 64);
}

Batch DataLoader::batch(int64_t step) const {
  HP_CHECK(step >= 0) << "DataLoader: step " << step << " must be >= 0";
  const int64_t rows = local_batch();
  // One [rows, seq + 1] buffer; inputs and targets are its two overlapping views.
  auto buf = at::empty({rows, seq_ + 1}, at::kLong);
  auto* dst = buf.data_ptr<int64_t>();
  const int64_t* src = tokens_->data();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t start = window_start(step, dp_rank_ * rows + r);
    std::memcpy(dst + r * (seq_ + 1), src + start, (seq_ + 1) * sizeof(int64_t));
  }
  at::Tensor inputs = buf.narrow(1, 0, seq_), targets = buf.narrow(1, 1, seq_);
  if (positions_.defined()) inputs = inputs.index_select(1, positions_), targets = targets.index_select(1, positions_);
  return Batch{inputs.contiguous(), targets.contiguous(), step};
}

void DataLoader::shard_sequence(int64_t cp_rank, int64_t cp_size, bool load_balance) {
  shard_sequence(cp_rank, std::vector<int64_t>{cp_size}, load_balance);
}

void DataLoader::shard_sequence(int64_t cp_rank, const std::vector<int64_t>& cp_sizes, bool load_balance) {
  int64_t cp_size = 1;
  for (int64_t s : cp_sizes) cp_size *= s;
  HP_CHECK(cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size)
      << "DataLoader: cp rank " << cp_rank << " is not in [0, cp size " << cp_size << ")";
  HP_CHECK(seq_ >= cp_size) << "DataLoader: seq = " << seq_ << " leaves some of the " << cp_size
                            << " cp ranks without a token";
  if (cp_size == 1) {
    positions_ = at::Tensor();
    return;
  }
  std::vector<int64_t> positions;
  for (const SequenceRun& r : sequence_runs(nested_sequence_lengths(seq_, cp_sizes), static_cast<int>(cp_rank),
                                            load_balance))
    for (int64_t p = r.first; p < r.first + r.size; ++p) positions.push_back(p);
  positions_ = at::tensor(positions, at::kLong);
}

void DataLoader::order_sequence(const std::vector<int64_t>& cp_sizes, bool load_balance) {
  int64_t cp_size = 1;
  for (int64_t s : cp_sizes) cp_size *= s;
  HP_CHECK(seq_ >= cp_size) << "DataLoader: seq = " << seq_ << " leaves some of the " << cp_size
                            << " cp ranks without a token";
  positions_ = cp_size == 1 ? at::Tensor()
                            : at::tensor(sequence_order(nested_sequence_lengths(seq_, cp_sizes), load_balance), at::kLong);
}

Batch DataLoader::next() { return batch(step_++); }

void DataLoader::seek(int64_t step) {
  HP_CHECK(step >= 0) << "DataLoader: cannot seek to step " << step;
  step_ = step;
}

}  // namespace hp::train
