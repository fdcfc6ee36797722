// Loading into any layout: each rank reads, from the chunks that overlap its piece of each
// tensor, only the checksum blocks that hold the overlap, verifies them, and copies the
// overlap into place.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "hp/checkpoint/state.h"

namespace hp::checkpoint {

// Fills every tensor of `state` from the checkpoint directory `dir` (a step-N directory)
// and replaces state.scalars with the checkpoint's. Errors name the tensor and file:
// missing tensors, other shapes or dtypes, chunks that do not cover a piece, truncated
// files, checksum mismatches. Needs no communication.
void load(const std::string& dir, State& state);

// `load` with the chunks of `m` (files relative to `dir`). Chunks without checksums are
// read unverified; with `convert`, tensors stored in another dtype are converted.
struct Metadata;
void load_from(const Metadata& m, const std::string& dir, State& state, bool convert);

// The whole tensor `name` of the checkpoint in `dir`, on one process (tools, tests).
at::Tensor read_tensor(const std::string& dir, const std::string& name);

}  // namespace hp::checkpoint
