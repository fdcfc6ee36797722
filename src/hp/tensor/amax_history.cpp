#include "hp/tensor/amax_history.h"

#include <ATen/ATen.h>

#include <vector>

#include "hp/base/error.h"

namespace hp {

AmaxHistory::AmaxHistory(int length) : length_(length) {
  HP_CHECK(length > 0) << "an amax history needs a positive length, got " << length;
}

at::Tensor AmaxHistory::delayed_amax(const at::Tensor& current) {
  HP_CHECK(current.dim() == 0) << "delayed scaling keeps one amax per tensor (tensorwise)";
  at::Tensor amax =
      history_.empty() ? current : at::stack(std::vector<at::Tensor>(history_.begin(), history_.end())).amax();
  history_.push_back(current.detach().clone());
  if (static_cast<int>(history_.size()) > length_) history_.pop_front();
  return amax;
}

}  // namespace hp
