// Executing a FlattenedAllToAll step on this rank's piece.
#pragma once

#include <ATen/core/Tensor.h>

#include "hp/comm/device_mesh.h"
#include "hp/layout/redistribute_step.h"

namespace hp {

// Over the group of the step's mesh dims flattened, sends each member the part of this
// rank's piece that it takes (exchanged_box), all in one all-to-all, and assembles the
// parts that arrive into this rank's piece of `step.to`.
at::Tensor flattened_all_to_all(const at::Tensor& local, const RedistributeStep& step, const DeviceMesh& mesh);

}  // namespace hp
