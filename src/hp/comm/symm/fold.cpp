#include "hp/comm/symm/fold.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>

#include "hp/base/error.h"

namespace hp::symm {
namespace {

// NaN wins, as in at::maximum / at::minimum.
struct Sum {
  template <typename A> A operator()(A a, A b) const { return a + b; }
};
struct Product {
  template <typename A> A operator()(A a, A b) const { return a * b; }
};
struct Max {
  template <typename A> A operator()(A a, A b) const { return (a > b || a != a) ? a : b; }
};
struct Min {
  template <typename A> A operator()(A a, A b) const { return (a < b || a != a) ? a : b; }
};

template <typename T, typename Acc, typename Op>
void fold_blocks(T* dst, const std::vector<const char*>& srcs, int64_t numel, bool average) {
  constexpr int64_t kBlock = 1024;  // the accumulator stays in L1
  const int n = static_cast<int>(srcs.size());
  Op op;
  Acc acc[kBlock];
  for (int64_t b = 0; b < numel; b += kBlock) {
    const int64_t m = std::min(kBlock, numel - b);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + b;
    for (int64_t j = 0; j < m; ++j) acc[j] = static_cast<Acc>(s0[j]);
    for (int r = 1; r < n; ++r) {
      const T* s = reinterpret_cast<const T*>(srcs[r]) + b;
      for (int64_t j = 0; j < m; ++j) acc[j] = op(acc[j], static_cast<Acc>(s[j]));
    }
    if (average)
      for (int64_t j = 0; j < m; ++j) acc[j] = static_cast<Acc>(acc[j] / static_cast<Acc>(n));
    for (int64_t j = 0; j < m; ++j) dst[b + j] = static_cast<T>(acc[j]);
  }
}

template <typename T, typename Acc>
void fold_typed(void* dst, const std::vector<const char*>& srcs, int64_t numel, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  switch (op) {
    case ReduceOp::Sum: return fold_blocks<T, Acc, Sum>(d, srcs, numel, false);
    case ReduceOp::Avg: return fold_blocks<T, Acc, Sum>(d, srcs, numel, true);
    case ReduceOp::Product: return fold_blocks<T, Acc, Product>(d, srcs, numel, false);
    case ReduceOp::Max: return fold_blocks<T, Acc, Max>(d, srcs, numel, false);
    case ReduceOp::Min: return fold_blocks<T, Acc, Min>(d, srcs, numel, false);
  }
}

}  // namespace

bool can_fold(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

void fold(void* dst, const std::vector<const char*>& srcs, int64_t numel, at::ScalarType dtype, ReduceOp op) {
  if (numel <= 0) return;
  switch (dtype) {
    case at::kFloat: return fold_typed<float, float>(dst, srcs, numel, op);
    case at::kDouble: return fold_typed<double, double>(dst, srcs, numel, op);
    case at::kHalf: return fold_typed<c10::Half, float>(dst, srcs, numel, op);
    case at::kBFloat16: return fold_typed<c10::BFloat16, float>(dst, srcs, numel, op);
    case at::kByte: return fold_typed<uint8_t, uint8_t>(dst, srcs, numel, op);
    case at::kChar: return fold_typed<int8_t, int8_t>(dst, srcs, numel, op);
    case at::kShort: return fold_typed<int16_t, int16_t>(dst, srcs, numel, op);
    case at::kInt: return fold_typed<int32_t, int32_t>(dst, srcs, numel, op);
    case at::kLong: return fold_typed<int64_t, int64_t>(dst, srcs, numel, op);
    default: HP_FAIL() << "shared-memory reduction of dtype " << dtype << " is not supported";
  }
}

}  // namespace hp::symm
