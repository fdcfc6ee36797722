#include "hp/parallel/zero_stage.h"

#include "hp/base/error.h"

namespace hp {

FullyShardOptions zero_stage_options(int stage, FullyShardOptions base) {
  HP_CHECK(stage >= 1 && stage <= 3)
      << "ZeRO stage " << stage << ": expected 1, 2 or 3 (0 is DDP)";
  base.reshard_after_forward = stage == 3;
  base.reshard_after_backward =
      true; // prepare_zero_backward keeps stages 1 and 2 gathered
  return base;
}

void prepare_zero_backward(FSDPModule &unit, int stage, bool last) {
  HP_CHECK(stage >= 1 && stage <= 3)
      << "ZeRO stage " << stage << ": expected 1, 2 or 3 (0 is DDP)";
  // The optimizer updates the shards after the last backward: no gather may
  // outlive it.
  unit.set_reshard_after_backward(stage == 3 || last);
  unit.set_requires_gradient_sync(stage != 1 || last);
}

} // namespace hp
