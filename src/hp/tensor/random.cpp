#include "hp/tensor/random.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "hp/base/error.h"
#include "hp/tensor/ops.h"

namespace hp {
namespace {

thread_local RngState t_state;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits, from the counter.
double uniform_at(uint64_t seed, uint64_t counter) {
  return (splitmix64(splitmix64(counter) ^ seed) >> 11) * 0x1.0p-53;
}

enum class Dist { Uniform, Normal };

// One value of `dist` at the element with flat index `g` of the whole tensor.
double value_at(Dist dist, const RngState& s, uint64_t g) {
  if (dist == Dist::Uniform) return uniform_at(s.seed, s.offset + g);
  // Box-Muller on the element's two counters
  const uint64_t c = s.offset + 2 * g;
  const double u1 = 1.0 - uniform_at(s.seed, c), u2 = uniform_at(s.seed, c + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Draws the block [offset, offset + shape) of a tensor of `global` shape, as `dtype`:
// every value is computed in double and rounded once, straight into a float32 or float64
// output (what a double tensor's .to() would give); other dtypes go through a double one.
// Every element is a function of its counter alone, so rows of the block are drawn on
// ATen's intra-op threads (this file is compiled with OpenMP) with the numbers of one thread.
at::Tensor draw(Dist dist, const std::vector<int64_t>& global, const std::vector<int64_t>& offset,
                const std::vector<int64_t>& shape, RngState s, at::ScalarType dtype = at::kDouble) {
  if (dtype != at::kFloat && dtype != at::kDouble) return draw(dist, global, offset, shape, s).to(dtype);
  const int nd = static_cast<int>(global.size());
  std::vector<int64_t> stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * global[d + 1];
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  at::Tensor out = at::empty(shape, dtype);
  if (n == 0) return out;
  const int64_t cols = nd ? shape[nd - 1] : 1, rows = n / cols;
  const uint64_t first_col = nd ? static_cast<uint64_t>(offset[nd - 1]) : 0;
  constexpr int64_t kValuesPerTask = 1 << 14;
  AT_DISPATCH_FLOATING_TYPES(dtype, "draw", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, std::max<int64_t>(1, kValuesPerTask / cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        uint64_t g = first_col;  // the row's first element, as a flat index of the whole tensor
        for (int64_t d = nd - 2, rest = r; d >= 0; --d) {
          g += static_cast<uint64_t>((offset[d] + rest % shape[d]) * stride[d]);
          rest /= shape[d];
        }
        scalar_t* row = p + r * cols;
        for (int64_t j = 0; j < cols; ++j) row[j] = static_cast<scalar_t>(value_at(dist, s, g + static_cast<uint64_t>(j)));
      }
    });
  });
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

// Counters one value of `dist` consumes: Box-Muller takes two uniforms per normal.
uint64_t counters_per_value(Dist dist) { return dist == Dist::Normal ? 2 : 1; }

// The state for one draw of `numel` values; advances the thread's offset past every
// counter the draw consumes, so the next draw never reuses one.
RngState take(Dist dist, int64_t numel) {
  RngState s = t_state;
  t_state.offset += counters_per_value(dist) * static_cast<uint64_t>(numel);
  return s;
}

DTensor draw_dtensor(Dist dist, const std::vector<int64_t>& shape, const DeviceMesh& mesh,
                     std::vector<Placement> placements, at::ScalarType dtype) {
  ShardSpec spec = make_spec(shape, dtype, mesh, std::move(placements));
  HP_CHECK(!spec.has_partial()) << "random tensors cannot be Partial: " << spec.to_string();
  RngState s = take(dist, numel_of(shape));
  auto coord = mesh.coordinate();
  // A dry-run on meta tensors draws nothing (the offset still advances, as on a device).
  if (mesh.device_type() == "meta") return DTensor(at::empty(spec.local_shape(coord), tensor_options(mesh, dtype)), mesh, spec);
  at::Tensor local = draw(dist, shape, spec.global_offset(coord), spec.local_shape(coord), s, dtype);
  return DTensor(local, mesh, spec);
}

at::Tensor dropout_mask(const std::vector<int64_t>& global, const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& shape, RngState s, double p, at::ScalarType dtype) {
  return (draw(Dist::Uniform, global, offset, shape, s) >= p).to(dtype) / (1.0 - p);
}

}  // namespace

void manual_seed(uint64_t seed) { t_state = RngState{seed, 0}; }
RngState get_rng_state() { return t_state; }
RngState reserve_randn(const std::vector<int64_t>& shape) { return take(Dist::Normal, numel_of(shape)); }
void set_rng_state(RngState state) { t_state = state; }

at::Tensor rand(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  return draw(Dist::Uniform, shape, std::vector<int64_t>(shape.size(), 0), shape, take(Dist::Uniform, numel_of(shape)),
              dtype);
}

at::Tensor randn(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  return draw(Dist::Normal, shape, std::vector<int64_t>(shape.size(), 0), shape, take(Dist::Normal, numel_of(shape)),
              dtype);
}

at::Tensor dropout(const at::Tensor& x, double p) {
  HP_CHECK(p >= 0 && p < 1) << "dropout probability must be in [0, 1), got " << p;
  auto shape = x.sizes().vec();
  RngState s = take(Dist::Uniform, numel_of(shape));
  return x * dropout_mask(shape, std::vector<int64_t>(shape.size(), 0), shape, s, p, x.scalar_type());
}

DTensor rand(const std::vector<int64_t>& shape, const DeviceMesh& mesh, std::vector<Placement> placements,
             at::ScalarType dtype) {
  return draw_dtensor(Dist::Uniform, shape, mesh, std::move(placements), dtype);
}

DTensor randn(const std::vector<int64_t>& shape, const DeviceMesh& mesh, std::vector<Placement> placements,
              at::ScalarType dtype) {
  return draw_dtensor(Dist::Normal, shape, mesh, std::move(placements), dtype);
}

DTensor dropout(const DTensor& x, double p) {
  HP_CHECK(p >= 0 && p < 1) << "dropout probability must be in [0, 1), got " << p;
  RngState s = take(Dist::Uniform, numel_of(x.sizes()));
  const std::vector<int64_t> global = x.sizes();
  return dispatch(Op::elementwise(1).named("dropout"), {x}, [&](const auto& t, const LocalContext& ctx) {
    return t[0] * dropout_mask(global, ctx.output.global_offset(ctx.coord), ctx.output.local_shape(ctx.coord), s, p,
                               t[0].scalar_type());
  });
}

}  // namespace hp
