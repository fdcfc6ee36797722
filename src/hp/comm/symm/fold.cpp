#include "hp/comm/symm/fold.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

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

constexpr int64_t kBlock = 1024;  // a block of the result stays in L1 across the passes

// Accumulating in the element type: folds straight into `dst`, which then stays in L1 while
// each further source is added, with no staging copies.
template <typename T, typename Op>
void fold_in_place(T* __restrict dst, const std::vector<const char*>& srcs, int64_t numel, bool average) {
  const int n = static_cast<int>(srcs.size());
  Op op;
  // Dividing a float by a power of two is multiplying by its exact inverse.
  const bool exact_inverse = std::is_floating_point_v<T> && (n & (n - 1)) == 0;
  const T inverse = static_cast<T>(1) / static_cast<T>(n);
  for (int64_t b = 0; b < numel; b += kBlock) {
    const int64_t m = std::min(kBlock, numel - b);
    T* __restrict d = dst + b;
    const T* __restrict s0 = reinterpret_cast<const T*>(srcs[0]) + b;
    if (n == 1) std::copy(s0, s0 + m, d);
    else {
      const T* __restrict s1 = reinterpret_cast<const T*>(srcs[1]) + b;
      for (int64_t j = 0; j < m; ++j) d[j] = op(s0[j], s1[j]);
    }
    for (int r = 2; r < n; ++r) {
      const T* __restrict s = reinterpret_cast<const T*>(srcs[r]) + b;
      for (int64_t j = 0; j < m; ++j) d[j] = op(d[j], s[j]);
    }
    if (!average) continue;
    if (exact_inverse)  // the same bits as dividing, for a fraction of the time
      for (int64_t j = 0; j < m; ++j) d[j] = d[j] * inverse;
    else
      for (int64_t j = 0; j < m; ++j) d[j] = static_cast<T>(d[j] / static_cast<T>(n));
  }
}

// Accumulating wider than the element type (16-bit floats): a block of float32 partial
// results, rounded once at the end.
template <typename T, typename Acc, typename Op>
void fold_widened(T* dst, const std::vector<const char*>& srcs, int64_t numel, bool average) {
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

template <typename T, typename Acc, typename Op>
void fold_blocks(T* dst, const std::vector<const char*>& srcs, int64_t numel, bool average) {
  if constexpr (std::is_same_v<T, Acc>) fold_in_place<T, Op>(dst, srcs, numel, average);
  else fold_widened<T, Acc, Op>(dst, srcs, numel, average);
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
