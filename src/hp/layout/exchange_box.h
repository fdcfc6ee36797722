// Which part of a tensor one rank hands another when the pieces of a whole group of ranks
// change at once (StepKind::FlattenedAllToAll). The planner prices these transfers and the
// executor makes them, so both read this one rule.
#pragma once

#include <cstdint>
#include <vector>

#include "hp/layout/shard_spec.h"

namespace hp {

// A box of the global tensor.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// The piece of the rank at mesh coordinate `coord`.
Box box_of(const ShardSpec& spec, const std::vector<int64_t>& coord);
// Empty (numel 0) when they do not meet.
Box intersect(const Box& a, const Box& b);

// Whether the rank at `dst` takes data from the rank at `src`: where `from` replicates a
// mesh dim, a rank takes from the holder with its own coordinate there, so that every
// element comes from exactly one member and the senders share the work.
bool takes_from(const ShardSpec& from, const std::vector<int64_t>& src, const std::vector<int64_t>& dst);

// What the rank at `src` (holding its piece of `from`) sends the rank at `dst` (to hold
// its piece of `to`); the two are in one group, so they differ only on its mesh dims.
Box exchanged_box(const ShardSpec& from, const ShardSpec& to, const std::vector<int64_t>& src,
                  const std::vector<int64_t>& dst);

}  // namespace hp
