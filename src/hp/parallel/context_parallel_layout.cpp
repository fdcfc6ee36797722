#include "hp/parallel/context_parallel_layout.h"

#include "hp/base/error.h"
#include "hp/layout/shard_spec.h"

namespace hp {

std::vector<int64_t> sequence_lengths(int64_t seq, int cp) {
  HP_CHECK(cp > 0 && seq >= 0) << "sequence layout: " << seq << " tokens over " << cp << " cp ranks";
  std::vector<int64_t> lengths;
  for (int r = 0; r < cp; ++r) lengths.push_back(chunk_range(seq, cp, r).size);
  return lengths;
}

std::vector<SequenceRun> sequence_runs(const std::vector<int64_t>& len, int rank, bool load_balance) {
  const int cp = static_cast<int>(len.size());
  HP_CHECK(rank >= 0 && rank < cp) << "sequence layout: rank " << rank << " of " << cp << " cp ranks";
  std::vector<SequenceRun> runs;
  auto add = [&runs](int64_t first, int64_t size) {
    if (size > 0) runs.push_back({first, size});
  };
  if (!load_balance) {
    int64_t first = 0;
    for (int r = 0; r < rank; ++r) first += len[r];
    add(first, len[rank]);
    return runs;
  }
  // Heads take the larger half of each rank's share; all heads come before all tails.
  auto head = [&len](int r) { return (len[r] + 1) / 2; };
  int64_t head_first = 0, heads = 0;
  for (int r = 0; r < cp; ++r) {
    if (r < rank) head_first += head(r);
    heads += head(r);
  }
  int64_t tail_first = heads;
  for (int r = cp - 1; r > rank; --r) tail_first += len[r] - head(r);
  add(head_first, head(rank));
  add(tail_first, len[rank] - head(rank));
  return runs;
}

std::vector<SequenceRun> sequence_runs(int64_t seq, int cp, int rank, bool load_balance) {
  return sequence_runs(sequence_lengths(seq, cp), rank, load_balance);
}

std::vector<int64_t> sequence_order(const std::vector<int64_t>& lengths, bool load_balance) {
  std::vector<int64_t> order;
  for (int r = 0; r < static_cast<int>(lengths.size()); ++r)
    for (const SequenceRun& run : sequence_runs(lengths, r, load_balance))
      for (int64_t p = run.first; p < run.first + run.size; ++p) order.push_back(p);
  return order;
}

std::vector<int64_t> nested_sequence_lengths(int64_t seq, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> lengths{seq};
  for (int64_t n : sizes) {
    std::vector<int64_t> next;
    for (int64_t l : lengths)
      for (int64_t piece : sequence_lengths(l, static_cast<int>(n))) next.push_back(piece);
    lengths = next;
  }
  return lengths;
}

std::vector<int64_t> sequence_positions(int64_t seq, int cp, int rank, bool load_balance) {
  std::vector<int64_t> pos;
  for (const SequenceRun& run : sequence_runs(seq, cp, rank, load_balance))
    for (int64_t p = run.first; p < run.first + run.size; ++p) pos.push_back(p);
  return pos;
}

std::vector<int64_t> sequence_order(int64_t seq, int cp, bool load_balance) {
  return sequence_order(sequence_lengths(seq, cp), load_balance);
}

}  // namespace hp
