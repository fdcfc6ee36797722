#include "hp/tensor/fp8_matmul.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <tuple>

#include "hp/base/error.h"

#ifdef HP_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace hp {
namespace {

bool device_has_fp8_gemm(const at::Device& d) {
#ifdef HP_CUDA
  if (!d.is_cuda()) return false;
  const cudaDeviceProp* p = d.has_index() ? at::cuda::getDeviceProperties(d.index()) : at::cuda::getCurrentDeviceProperties();
  return p->major * 10 + p->minor >= 89;
#else
  (void)d;
  return false;
#endif
}

// _scaled_mm's refusals, by scaling and operand dtypes: asked once, then emulated.
using RefusalKey = std::tuple<Fp8Scaling, at::ScalarType, at::ScalarType>;
std::mutex refusals_mu;
std::map<RefusalKey, std::string>& refusals() {
  static std::map<RefusalKey, std::string> r;
  return r;
}

std::string static_fallback(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Scaling s) {
  if (!a.data.is_cuda()) return "not on CUDA";
  if (!device_has_fp8_gemm(a.data.device())) return "the device has no FP8 GEMM (compute capability < 8.9)";
  if (s == Fp8Scaling::MxBlock) return "mx_block: 1x32 block scales need compute capability 10.x in LibTorch 2.11";
  if (a.data.scalar_type() == at::kFloat8_e5m2 && b.data.scalar_type() == at::kFloat8_e5m2)
    return "both operands E5M2";
  // cuBLASLt's FP8 GEMM wants 16-aligned leading dims.
  if (a.data.size(0) % 16 || a.data.size(1) % 16 || b.data.size(0) % 16)
    return "dims not multiples of 16 (" + std::to_string(a.data.size(0)) + ", " + std::to_string(a.data.size(1)) +
           ", " + std::to_string(b.data.size(0)) + ")";
  return "";
}

at::Tensor emulated(const Fp8Tensor& a, const Fp8Tensor& b) {
  return at::matmul(a.dequantized(), b.dequantized().t());
}

// _scaled_mm multiplies by the inverse scales: a row-major [m, k] times a column-major [k, n].
at::Tensor scaled_mm(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Scaling s) {
  at::Tensor sa = a.scale.reciprocal(), sb = b.scale.reciprocal();
  if (s == Fp8Scaling::Rowwise) sa = sa.reshape({-1, 1}).contiguous(), sb = sb.reshape({1, -1}).contiguous();
  return at::_scaled_mm(a.data.contiguous(), b.data.contiguous().t(), sa, sb, std::nullopt, std::nullopt, at::kFloat);
}

}  // namespace

std::string fp8_mm_fallback(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Scaling s) {
  std::string why = static_fallback(a, b, s);
  if (!why.empty()) return why;
  std::lock_guard<std::mutex> lock(refusals_mu);
  auto it = refusals().find({s, a.data.scalar_type(), b.data.scalar_type()});
  return it == refusals().end() ? "" : it->second;
}

at::Tensor fp8_mm(const Fp8Tensor& a, const Fp8Tensor& b, Fp8Scaling s) {
  HP_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1))
      << "fp8_mm multiplies [m, k] by [n, k]^T, got " << a.data.sizes() << " and " << b.data.sizes();
  if (!fp8_mm_fallback(a, b, s).empty()) return emulated(a, b);
  try {
    return scaled_mm(a, b, s);
  } catch (const c10::Error& e) {
    // Argument checks (rowwise with a float32 output or E5M2 in some versions) fail
    // before any kernel runs: the emulated product stands in, from now on.
    std::lock_guard<std::mutex> lock(refusals_mu);
    refusals()[{s, a.data.scalar_type(), b.data.scalar_type()}] =
        std::string("_scaled_mm refused: ") + e.what_without_backtrace();
  }
  return emulated(a, b);
}

}  // namespace hp
