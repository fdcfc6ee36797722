// Where the tokens of a sequence live under context parallelism. The sequence is held in a
// reordered form, sharded evenly (torch.chunk sizes) over the cp ranks: rank r holds piece r
// of the reordered sequence, as a DTensor Shard(1) gives it. Per-token work (embeddings,
// norms, MLPs, the loss) does not care about the order; attention reads the true positions
// from here for rotary and the causal mask.
//
// Contiguous: the natural order, rank r holds one run of positions.
// Load-balanced (head-tail, "zigzag"): rank r holds a head run from the front of the
// sequence and a tail run from its back (heads in rank order, tails in reverse rank order),
// so under a causal mask every rank attends over about the same number of keys.
// Pure arithmetic, no tensors.
#pragma once

#include <cstdint>
#include <vector>

namespace hp {

// A run of consecutive global positions [first, first + size).
struct SequenceRun {
  int64_t first = 0;
  int64_t size = 0;
};

// The runs cp rank `rank` holds, in the order it holds them (empty runs left out).
std::vector<SequenceRun> sequence_runs(int64_t seq, int cp, int rank, bool load_balance);
// The global positions cp rank `rank` holds, in order.
std::vector<int64_t> sequence_positions(int64_t seq, int cp, int rank, bool load_balance);
// The reordered sequence: entry i is the global position of its token i (every rank's
// positions, rank 0's first).
std::vector<int64_t> sequence_order(int64_t seq, int cp, bool load_balance);
// Tokens per cp rank (torch.chunk sizes).
std::vector<int64_t> sequence_lengths(int64_t seq, int cp);

// The same for any tokens per rank: a sequence sharded over two mesh dims (hybrid), whose
// shares are torch.chunk pieces of torch.chunk pieces.
std::vector<SequenceRun> sequence_runs(const std::vector<int64_t>& lengths, int rank, bool load_balance);
std::vector<int64_t> sequence_order(const std::vector<int64_t>& lengths, bool load_balance);
// Tokens per rank of `seq` split over mesh dims of `sizes` (outer first), ranks numbered
// with the outer dim major.
std::vector<int64_t> nested_sequence_lengths(int64_t seq, const std::vector<int64_t>& sizes);

}  // namespace hp
