#include "hp/layout/exchange_box.h"

#include <algorithm>

namespace hp {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Box box_of(const ShardSpec& spec, const std::vector<int64_t>& coord) {
  return {spec.global_offset(coord), spec.local_shape(coord)};
}

Box intersect(const Box& a, const Box& b) {
  Box out{a.offset, a.shape};
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t begin = std::max(a.offset[d], b.offset[d]);
    const int64_t end = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    out.offset[d] = begin;
    out.shape[d] = std::max<int64_t>(0, end - begin);
  }
  return out;
}

bool takes_from(const ShardSpec& from, const std::vector<int64_t>& src, const std::vector<int64_t>& dst) {
  for (int m = 0; m < from.mesh().ndim(); ++m)
    if (from.placement(m).is_replicate() && src[m] != dst[m]) return false;
  return true;
}

Box exchanged_box(const ShardSpec& from, const ShardSpec& to, const std::vector<int64_t>& src,
                  const std::vector<int64_t>& dst) {
  Box mine = box_of(from, src);
  if (!takes_from(from, src, dst)) {
    std::fill(mine.shape.begin(), mine.shape.end(), 0);
    return mine;
  }
  return intersect(mine, box_of(to, dst));
}

}  // namespace hp
