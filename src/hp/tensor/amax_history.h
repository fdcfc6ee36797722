// Delayed scaling: the amax a scale is computed from is the max of the last `length`
// recorded amaxes, not the current one, so a tensor is quantized with what its previous
// steps saw (a sudden jump saturates for one step, then the scale follows it for
// `length` steps). The first call, with nothing recorded, uses the current amax.
// One entry per call: recomputed forwards or a backward split in two record twice.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>

namespace hp {

class AmaxHistory {
 public:
  explicit AmaxHistory(int length);

  // The amax to scale this call with; then records `current` (a 0-dim float tensor).
  at::Tensor delayed_amax(const at::Tensor& current);
  int recorded() const { return static_cast<int>(history_.size()); }

 private:
  int length_;
  std::deque<at::Tensor> history_;
};

}  // namespace hp
