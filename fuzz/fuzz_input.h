// Reads small bounded values from fuzzer bytes (zeros once the bytes run out).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hp/layout/shard_spec.h"

namespace hp::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  int64_t next(int64_t bound) { return pos_ < size_ ? data_[pos_++] % bound : 0; }

  MeshShape mesh() {
    std::vector<int64_t> dims(1 + next(3));
    for (auto& d : dims) d = 1 + next(4);
    return MeshShape(dims);
  }
  std::vector<int64_t> shape() {
    std::vector<int64_t> s(next(4));
    for (auto& d : s) d = next(12);
    return s;
  }
  std::vector<Placement> placements(int ndim, int mesh_ndim) {
    std::vector<Placement> ps;
    for (int i = 0; i < mesh_ndim; ++i) {
      int64_t k = next(4 + ndim);
      if (k < ndim) ps.push_back(Shard(static_cast<int>(k)));
      else if (k == ndim) ps.push_back(Replicate());
      else ps.push_back(Partial(static_cast<ReduceOp>(k - ndim - 1)));  // sum, avg, max
    }
    return ps;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace hp::fuzz
