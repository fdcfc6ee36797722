#include "hp/tensor/fused_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace hp::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kRowGrain = 32;  // rows per task of at::parallel_for

// On meta (a dry-run) the same functions run without arithmetic, so that the dry-run keeps
// what a CPU run keeps.
bool cpu_real(const at::Tensor& t) {
  return t.defined() && (t.device().is_cpu() || t.is_meta()) &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

bool same_device(const at::Tensor& a, const at::Tensor& b) { return a.device() == b.device(); }

// Sum of a[j] * b[j] in 16 running sums (which the compiler keeps in vector registers), the
// same order on every call.
template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  constexpr int kLanes = 16;
  T lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] += a[j + k] * b[j + k];
  T s = 0;
  for (int k = 0; k < kLanes; ++k) s += lanes[k];
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

template <typename T>
void rms_norm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t d, double eps) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* xi = x + i * d;
      T* yi = y + i * d;
      const T r = T(1) / std::sqrt(dot(xi, xi, d) / T(d) + T(eps));
      rstd[i] = r;
      for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * r * w[j];
    }
  });
}

// dx = r * g - x * r^3 * sum(g * x) / d with g = dy * w; dw = sum over rows of dy * x * r,
// summed in float64 row after row (one order, whatever the thread count).
template <typename T>
void rms_norm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t rows, int64_t d) {
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    std::vector<T> g(d);
    for (int64_t i = begin; i < end; ++i) {
      const T *dyi = dy + i * d, *xi = x + i * d;
      T* dxi = dx + i * d;
      for (int64_t j = 0; j < d; ++j) g[j] = dyi[j] * w[j];
      const T r = rstd[i];
      const T k = r * r * r * dot(g.data(), xi, d) / T(d);
      for (int64_t j = 0; j < d; ++j) dxi[j] = r * g[j] - xi[j] * k;
    }
  });
  std::vector<double> acc(d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const T *dyi = dy + i * d, *xi = x + i * d;
    const T r = rstd[i];
    for (int64_t j = 0; j < d; ++j) acc[j] += double(dyi[j] * (xi[j] * r));
  }
  for (int64_t j = 0; j < d; ++j) dw[j] = T(acc[j]);
}

struct RMSNormFunction : torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps) {
    const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
    at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
    at::Tensor rstd = at::empty({rows}, x.options());
    if (!x.is_meta())
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
      rms_norm_forward(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(),
                       rstd.mutable_data_ptr<scalar_t>(), rows, d, eps);
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
    at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    at::Tensor dw = at::empty_like(w);
    if (!x.is_meta())
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
      rms_norm_backward(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                        rstd.const_data_ptr<scalar_t>(), dx.mutable_data_ptr<scalar_t>(),
                        dw.mutable_data_ptr<scalar_t>(), rows, d);
    });
    return {dx, dw, at::Tensor()};
  }
};

// One row's pairs, 8 at a time (which the compiler turns into vector operations, as it
// does SwiGLU's), then the remainder.
constexpr int kRotaryLanes = 8;

template <typename T>
void rotate_row(const T* __restrict x, const T* __restrict c, const T* __restrict sn, T* __restrict o,
                int64_t half, T sign) {
  int64_t j = 0;
  for (; j + kRotaryLanes <= half; j += kRotaryLanes) {
    T lo[kRotaryLanes], hi[kRotaryLanes];  // both halves made before either is stored
    for (int k = 0; k < kRotaryLanes; ++k) {
      const T x1 = x[j + k], x2 = x[j + k + half], sj = sign * sn[j + k];
      lo[k] = x1 * c[j + k] - x2 * sj;
      hi[k] = x2 * c[j + k] + x1 * sj;
    }
    for (int k = 0; k < kRotaryLanes; ++k) o[j + k] = lo[k];
    for (int k = 0; k < kRotaryLanes; ++k) o[j + k + half] = hi[k];
  }
  for (; j < half; ++j) {
    const T x1 = x[j], x2 = x[j + half], sj = sign * sn[j];
    o[j] = x1 * c[j] - x2 * sj;
    o[j + half] = x2 * c[j] + x1 * sj;
  }
}

// Rotates the pairs (x[j], x[j + half]) of every row of `x` ([B, H, S, D], strides in
// `stride`, the last one 1) by the table's angle of the row's position, clockwise when
// `inverse` (backward: the sine negated, which is exact), into `out` (strides in
// `out_stride`, the last one 1).
template <typename T>
void rotate(const T* x, const int64_t* size, const int64_t* stride, const T* cos, const T* sin, T* out,
            const int64_t* out_stride, bool inverse) {
  const int64_t heads = size[1], seq = size[2], d = size[3], half = d / 2;
  const T sign = inverse ? T(-1) : T(1);
  at::parallel_for(0, size[0] * heads * seq, kRowGrain, [&](int64_t begin, int64_t end) {
    int64_t s = begin % seq, h = (begin / seq) % heads, b = begin / (seq * heads);
    for (int64_t row = begin; row < end; ++row) {
      rotate_row(x + b * stride[0] + h * stride[1] + s * stride[2], cos + s * half, sin + s * half,
                 out + b * out_stride[0] + h * out_stride[1] + s * out_stride[2], half, sign);
      if (++s < seq) continue;
      s = 0;
      if (++h == heads) h = 0, ++b;
    }
  });
}

// The output keeps a dense input's layout: the heads' transposed view of a projection's
// [B, S, H, D] output rotates into [B, S, H, D] storage too, so that attention's output,
// laid out as its queries are, goes back to [B, S, H * D] as a view instead of a copy.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  at::Tensor out = x.is_non_overlapping_and_dense() ? at::empty_like(x)
                                                    : at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (!x.is_meta())
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rotary", [&] {
    rotate(x.const_data_ptr<scalar_t>(), x.sizes().data(), x.strides().data(), cos.const_data_ptr<scalar_t>(),
           sin.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), out.strides().data(), inverse);
  });
  return out;
}

struct RotaryFunction : torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rotate(x, cos, sin, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor dy = grads[0];
    if (dy.stride(-1) != 1) dy = dy.contiguous();
    return {rotate(dy, saved[0], saved[1], true), at::Tensor(), at::Tensor()};
  }
};

// Elements per task of at::parallel_for, and per sigmoid block inside one: ATen's
// vectorised sigmoid into a block that stays in cache, then the fused arithmetic, so that
// no sigmoid of the whole tensor is ever held.
constexpr int64_t kElementGrain = 1 << 15;
constexpr int64_t kSigmoidBlock = 1 << 14;

// fn(begin, end, s) over blocks of `gate`'s elements, s = sigmoid(gate[begin, end)).
template <typename T, typename Fn>
void for_sigmoid_blocks(const at::Tensor& gate, Fn fn) {
  const at::Tensor flat = gate.reshape(-1);
  at::parallel_for(0, flat.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; b += kSigmoidBlock) {
      const int64_t e = std::min(end, b + kSigmoidBlock);
      const at::Tensor s = at::sigmoid(flat.narrow(0, b, e - b));
      fn(b, e, s.const_data_ptr<T>());
    }
  });
}

// The arithmetic of one sigmoid block, 8 elements per step (which the compiler turns into
// vector operations, as it does the norms' running sums), then the remainder.
constexpr int kSwigluLanes = 8;

template <typename T>
void swiglu_block(const T* __restrict g, const T* __restrict s, const T* __restrict u, T* __restrict y, int64_t n) {
  int64_t i = 0;
  for (; i + kSwigluLanes <= n; i += kSwigluLanes)
    for (int k = 0; k < kSwigluLanes; ++k) y[i + k] = g[i + k] * s[i + k] * u[i + k];
  for (; i < n; ++i) y[i] = g[i] * s[i] * u[i];
}

// du = dy * silu(g), dg = dy * u * silu'(g) with silu'(g) = s + silu(g) * (1 - s).
template <typename T>
void swiglu_backward_block(const T* __restrict dy, const T* __restrict g, const T* __restrict s,
                           const T* __restrict u, T* __restrict dg, T* __restrict du, int64_t n) {
  int64_t i = 0;
  for (; i + kSwigluLanes <= n; i += kSwigluLanes) {
    for (int k = 0; k < kSwigluLanes; ++k) du[i + k] = dy[i + k] * (g[i + k] * s[i + k]);
    for (int k = 0; k < kSwigluLanes; ++k)
      dg[i + k] = dy[i + k] * u[i + k] * (s[i + k] + g[i + k] * s[i + k] * (T(1) - s[i + k]));
  }
  for (; i < n; ++i) {
    du[i] = dy[i] * (g[i] * s[i]);
    dg[i] = dy[i] * u[i] * (s[i] + g[i] * s[i] * (T(1) - s[i]));
  }
}

// The same, writing dg over g and du over u (a lane's both results are made before either
// is stored).
template <typename T>
void swiglu_backward_in_place_block(const T* __restrict dy, T* __restrict g, const T* __restrict s, T* __restrict u,
                                    int64_t n) {
  int64_t i = 0;
  for (; i + kSwigluLanes <= n; i += kSwigluLanes) {
    T dg[kSwigluLanes], du[kSwigluLanes];
    for (int k = 0; k < kSwigluLanes; ++k) du[k] = dy[i + k] * (g[i + k] * s[i + k]);
    for (int k = 0; k < kSwigluLanes; ++k)
      dg[k] = dy[i + k] * u[i + k] * (s[i + k] + g[i + k] * s[i + k] * (T(1) - s[i + k]));
    for (int k = 0; k < kSwigluLanes; ++k) g[i + k] = dg[k], u[i + k] = du[k];
  }
  for (; i < n; ++i) {
    const T dg = dy[i] * u[i] * (s[i] + g[i] * s[i] * (T(1) - s[i]));
    u[i] = dy[i] * (g[i] * s[i]);
    g[i] = dg;
  }
}

// Whether `t`, a saved input unpacked in backward, may be overwritten: the backward keeps no
// graph (nothing unpacks it again), and its storage has this one tensor, held only by the
// unpacked list and the saved variable, if that keeps it (it does not when hooks packed it).
bool reusable(const at::Tensor& t) {
  return !torch::autograd::get_current_graph_task_keep_graph() && t.is_contiguous() && t.has_storage() &&
         t.storage().use_count() == 1 && t.use_count() <= 2;
}

struct SwiGLUFunction : torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    at::Tensor y = at::empty_like(gate, at::MemoryFormat::Contiguous);
    if (!gate.is_meta())
      AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "swiglu", [&] {
        const scalar_t *g = gate.const_data_ptr<scalar_t>(), *u = up.const_data_ptr<scalar_t>();
        scalar_t* out = y.mutable_data_ptr<scalar_t>();
        for_sigmoid_blocks<scalar_t>(gate, [&](int64_t begin, int64_t end, const scalar_t* s) {
          swiglu_block(g + begin, s, u + begin, out + begin, end - begin);
        });
      });
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &up = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    // In place (gate and up become their own gradients) where nothing else can see them.
    const bool in_place = reusable(gate) && reusable(up);  // meta too: a dry-run counts what a run allocates
    const at::Tensor dg = in_place ? gate.detach() : at::empty_like(gate, at::MemoryFormat::Contiguous);
    const at::Tensor du = in_place ? up.detach() : at::empty_like(up, at::MemoryFormat::Contiguous);
    if (!gate.is_meta())
      AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "swiglu_backward", [&] {
        const scalar_t *g = gate.const_data_ptr<scalar_t>(), *u = up.const_data_ptr<scalar_t>();
        const scalar_t* d = dy.const_data_ptr<scalar_t>();
        scalar_t *dgp = dg.mutable_data_ptr<scalar_t>(), *dup = du.mutable_data_ptr<scalar_t>();
        for_sigmoid_blocks<scalar_t>(gate, [&](int64_t begin, int64_t end, const scalar_t* s) {
          if (in_place)
            swiglu_backward_in_place_block(d + begin, dgp + begin, s, dup + begin, end - begin);
          else
            swiglu_backward_block(d + begin, g + begin, s, u + begin, dgp + begin, dup + begin, end - begin);
        });
      });
    return {dg, du};
  }
};

}  // namespace

bool enabled() {
  const char* v = std::getenv("HP_FUSED_KERNELS");
  return !(v && std::string(v) == "0");
}

int threads_for_rows(int64_t rows) {
  std::atomic<int> tasks{0};
  at::parallel_for(0, rows, kRowGrain, [&](int64_t, int64_t) { ++tasks; });
  return tasks;
}

bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight) {
  return enabled() && cpu_real(x) && cpu_real(weight) && same_device(x, weight) && x.scalar_type() == weight.scalar_type() && x.dim() >= 1 &&
         weight.dim() == 1 && weight.size(0) == x.size(-1) && x.is_contiguous() && weight.is_contiguous();
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RMSNormFunction::apply(x, weight, eps);
}

bool rotary_fusable(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return enabled() && cpu_real(x) && cpu_real(cos) && cpu_real(sin) && same_device(x, cos) && same_device(x, sin) && x.dim() == 4 && x.size(-1) % 2 == 0 &&
         (x.size(-1) == 0 || x.stride(-1) == 1) && x.scalar_type() == cos.scalar_type() &&
         x.scalar_type() == sin.scalar_type() && cos.dim() == 2 && cos.size(0) == x.size(2) &&
         cos.size(1) == x.size(-1) / 2 && cos.sizes() == sin.sizes() && cos.is_contiguous() && sin.is_contiguous();
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFunction::apply(x, cos, sin);
}

bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up) {
  return enabled() && cpu_real(gate) && cpu_real(up) && same_device(gate, up) &&
         gate.scalar_type() == up.scalar_type() && gate.sizes() == up.sizes() && gate.is_contiguous() &&
         up.is_contiguous();
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return SwiGLUFunction::apply(gate, up); }

}  // namespace hp::fused
