// Parameters that live in a storage tier between uses, as fully_shard keeps its shards and
// their gradients under an offload policy. Whatever reads or updates them (an optimizer
// step, gradient clipping, a checkpoint) brings them in first; send_out() writes back what
// may have changed and releases their memory.
#pragma once

#include <vector>

namespace hp {
class DTensor;
}

namespace hp::memory {

class OffloadedParameters {
 public:
  virtual ~OffloadedParameters() = default;
  // Data and gradients of those of `params` that are offloaded into memory (the others are
  // left alone). Safe on one thread while another sends out other parameters.
  virtual void bring_in(const std::vector<DTensor*>& params) = 0;
  // Their gradients alone: to read (`changing` false: send_out() releases them unwritten)
  // or to change in place.
  virtual void bring_in_grads(const std::vector<DTensor*>& params, bool changing) = 0;
  // Writes the data of those brought in (an update may have changed it) and releases it and
  // the gradient. A failed write is an error naming the file; what it held stays in memory.
  virtual void send_out(const std::vector<DTensor*>& params) = 0;
};

}  // namespace hp::memory
