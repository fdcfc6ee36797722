// What the chunked token exchange (token_dispatcher_chunks.cpp) shares with the unchunked
// one: the reordering of arrived rows, and the plan of one chunked dispatch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hp/parallel/token_dispatcher.h"

namespace hp {

// Rows arrived grouped by source rank, then by expert (arrived[s * experts + e] of them)
// -> the permutation that groups them by expert, then source; per_expert gets the counts.
at::Tensor expert_major_order(const int64_t* arrived, int sources, int64_t experts, std::vector<int64_t>* per_expert);

// One rank's view of a chunked dispatch: the first and the last chunk hold the sorted rows
// bound for this rank's own experts (half each), which stay; chunk c of the others holds
// the sorted rows of tokens [(c - 1) * ceil(T / C), ...) bound for other ranks' experts, in
// expert order.
struct AllToAllTokenDispatcher::ChunkPlan {
  std::vector<at::Tensor> rows;                   // per chunk: its rows of the sorted tokens
  std::vector<std::vector<int64_t>> send, recv;   // per chunk: rows to / from each peer
  std::vector<at::Tensor> by_expert;              // per chunk: arrived rows in expert order (undefined: already)
  std::vector<std::vector<int64_t>> per_expert;   // per chunk: rows per local expert
  bool stays(size_t c) const { return c == 0 || c + 1 == rows.size(); }  // a local chunk, not exchanged
  int64_t kept = 0;                               // sorted rows in all
};

}  // namespace hp
