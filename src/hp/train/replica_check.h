// Silent data corruption: parameters that the ranks of a mesh dim must hold bit for bit
// alike (Replicate there: over dp under ddp and replicate, over tp for the norms' weights)
// are checksummed (XXH3 over the bytes of their local tensors) and compared across that
// dim. Under fully_shard a parameter is sharded over dp: each dp rank holds a shard of its
// own, so there is nothing to compare over dp (its Replicate dims, if any, are compared).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hp/tensor/dtensor.h"

namespace hp::train {

// On every rank in the same order: one all-gather over each mesh the parameters live on.
// The first parameter whose copies differ, with `step` and the global ranks whose copy
// differs from the one most of the ranks that must agree hold (all of them when no copy
// has a majority: two replicas cannot say which one is wrong); "" when all agree. Every
// rank of a mesh returns the same.
std::string find_replica_mismatch(const std::vector<std::pair<std::string, DTensor*>>& params, int64_t step);

// The group ranks whose value is not the one held by more than half of them; all of them
// when no value is; none when they all agree.
std::vector<int> minority_ranks(const std::vector<uint64_t>& values);

}  // namespace hp::train
