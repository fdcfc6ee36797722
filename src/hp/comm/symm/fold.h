// The element-wise reduction of the shared-memory collectives, without ATen dispatch:
// small messages are dominated by per-op overhead, large ones by memory passes (this
// makes one pass over each input, in cache-sized blocks).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "hp/base/reduce_op.h"

namespace hp::symm {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[n-1][i]), folded left to right (rank
// order), so the bits do not depend on timing. float16 and bfloat16 accumulate in float32
// and round once; Avg divides the sum by n (integers truncate, like Gloo's path). `dst`
// may alias no source.
void fold(void* dst, const std::vector<const char*>& srcs, int64_t numel, at::ScalarType dtype, ReduceOp op);

bool can_fold(at::ScalarType dtype);

}  // namespace hp::symm
