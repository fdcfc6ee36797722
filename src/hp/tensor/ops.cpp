#include "hp/tensor/ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <limits>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/autograd.h"
#include "hp/comm/collectives.h"
#include "hp/layout/sharding_propagation.h"
#include "hp/tensor/fused_cpu.h"
#include "hp/tensor/meta_ops.h"
#include "hp/tensor/op_observer.h"
#include "hp/tensor/redistribute.h"

namespace hp {
namespace {

void check_same_mesh(const Op& op, const std::vector<DTensor>& inputs) {
  for (size_t i = 1; i < inputs.size(); ++i)
    HP_CHECK(inputs[i].device_mesh() == inputs[0].device_mesh())
        << op.to_string() << ": input 0 lives on " << inputs[0].device_mesh().to_string() << " but input " << i
        << " on " << inputs[i].device_mesh().to_string();
}

void check_same_dtype(const Op& op, const DTensor& a, const DTensor& b) {
  HP_CHECK(a.scalar_type() == b.scalar_type())
      << op.to_string() << ": dtypes differ, " << a.scalar_type() << " " << to_string_list(a.sizes()) << " vs "
      << b.scalar_type() << " " << to_string_list(b.sizes());
}

DTensor binary_same_dtype(const Op& op, const DTensor& a, const DTensor& b, const LocalKernel& k) {
  check_same_dtype(op, a, b);
  return dispatch(op, {a, b}, k);
}

// The first mesh dim sharding tensor dim 0 of `spec`'s table, with its row range.
std::pair<int64_t, int64_t> local_rows(const ShardSpec& spec, const std::vector<int64_t>& coord) {
  return {spec.global_offset(coord)[0], spec.local_shape(coord)[0]};
}

int64_t wrap_dim(const DTensor& x, int64_t d, const char* op) {
  HP_CHECK(d >= -x.dim() && d < x.dim()) << op << ": dim " << d << " out of range for shape "
                                         << to_string_list(x.sizes());
  return d < 0 ? d + x.dim() : d;
}

// ATen rejects a max over an empty dim; an empty piece (uneven shards) holds no candidate,
// so it gives the lowest value, which never wins the max across ranks.
at::Tensor local_amax(const at::Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  for (int64_t d : dims)
    if (t.size(d) == 0) {
      at::Tensor none = t.sum(dims, keepdim).to(t.scalar_type());  // zeros, still linked to t
      if (t.is_floating_point()) return none - std::numeric_limits<double>::infinity();
      AT_DISPATCH_INTEGRAL_TYPES(t.scalar_type(), "amax", [&] { none.fill_(std::numeric_limits<scalar_t>::lowest()); });
      return none;
    }
  return t.amax(dims, keepdim);
}

// Identity forward (an alias of x); the gradient is multiplied by `factor` on its way back.
at::Tensor scale_backward(const at::Tensor& x, double factor) {
  return comm::autograd::attach_backward(
      x.detach(), x, [factor](const at::Tensor& grad) { return grad * factor; }, "ScaleBackward");
}

}  // namespace

DTensor dispatch(const Op& op, const std::vector<DTensor>& inputs, const LocalKernel& kernel) {
  HP_CHECK(!inputs.empty()) << op.to_string() << " needs inputs";
  check_same_mesh(op, inputs);
  const DeviceMesh& mesh = inputs[0].device_mesh();
  std::vector<ShardSpec> specs;
  for (const auto& t : inputs) specs.push_back(t.spec());
  auto decision = propagate(op, specs);
  const std::vector<int64_t> coord = mesh.coordinate();

  std::vector<at::Tensor> locals;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor x = redistribute_local(inputs[i].to_local(), specs[i], decision->inputs[i], mesh);
    for (int k = 0; k < mesh.ndim(); ++k) {
      const bool replicated_in = decision->inputs[i].placement(k).is_replicate();
      const bool deferred = inputs[i].defers_grad_reduction(k);
      HP_CHECK(!deferred || replicated_in)
          << op.to_string() << ": input " << i << " must stay replicated on mesh dim " << k
          << " (its gradient is reduced there by a data-parallel wrapper) but the op wants "
          << decision->inputs[i].to_string();
      if (!replicated_in || !x.requires_grad()) continue;
      // A replicated input meeting a split output receives per-rank partial gradients: sum
      // them now, or, when a wrapper reduces them later, leave them partial. A deferred input
      // meeting a replicated output receives the whole gradient on every rank: scale it so
      // that the wrapper's sum restores it.
      const bool replicated_out = decision->output.placement(k).is_replicate();
      if (!replicated_out && !deferred) x = comm::autograd::all_reduce_sum_backward(x, mesh.group(k));
      if (replicated_out && deferred) x = scale_backward(x, 1.0 / double(mesh.size(k)));
    }
    locals.push_back(x);
  }
  ObservedOp observed;
  observed.op = op;
  observed.inputs = &locals;
  at::Tensor out = observe_op(observed, [&] { return kernel(locals, LocalContext{decision->inputs, decision->output, coord}); });
  return DTensor(out, mesh, decision->output);
}

DTensor add(const DTensor& a, const DTensor& b) {
  return binary_same_dtype(Op::add(), a, b, [](const auto& x, const auto&) { return x[0] + x[1]; });
}

DTensor sub(const DTensor& a, const DTensor& b) {
  return binary_same_dtype(Op::add(), a, b, [](const auto& x, const auto&) { return x[0] - x[1]; });
}

DTensor mul(const DTensor& a, const DTensor& b) {
  return binary_same_dtype(Op::mul(), a, b, [](const auto& x, const auto&) { return x[0] * x[1]; });
}

DTensor matmul(const DTensor& a, const DTensor& b) {
  return binary_same_dtype(Op::matmul(), a, b, [](const auto& x, const auto&) { return at::matmul(x[0], x[1]); });
}

const char* const kAtLinearLabel = "linear";

DTensor linear(const DTensor& x, const DTensor& weight) {
  return binary_same_dtype(Op::linear().named(kAtLinearLabel), x, weight,
                           [](const auto& t, const auto&) { return at::linear(t[0], t[1]); });
}

DTensor sum(const DTensor& x, std::vector<int64_t> dims, bool keepdim) {
  return dispatch(Op::sum(dims, keepdim), {x},
                  [dims, keepdim](const auto& t, const auto&) { return t[0].sum(dims, keepdim); });
}

DTensor mean(const DTensor& x, std::vector<int64_t> dims, bool keepdim) {
  // A mean over a sharded dim is a local mean of an even shard, pending an average.
  return dispatch(Op::mean(dims, keepdim), {x},
                  [dims, keepdim](const auto& t, const auto&) { return t[0].mean(dims, keepdim); });
}

DTensor softmax(const DTensor& x, int64_t dim) {
  return dispatch(Op::softmax(dim), {x}, [dim](const auto& t, const auto&) { return t[0].softmax(dim); });
}

DTensor log_softmax(const DTensor& x, int64_t dim) {
  return dispatch(Op::softmax(dim).named("log_softmax"), {x},
                  [dim](const auto& t, const auto&) { return t[0].log_softmax(dim); });
}

DTensor scaled_dot_product_attention(const DTensor& q, const DTensor& k, const DTensor& v, bool causal,
                                     std::optional<double> scale) {
  return dispatch(Op::attention(), {q, k, v}, [causal, scale](const auto& t, const LocalContext& ctx) {
    const at::Tensor &lq = t[0], &lk = t[1], &lv = t[2];
    const int64_t first = ctx.output.global_offset(ctx.coord)[2];
    if (!causal || (first == 0 && lq.size(2) == lk.size(2))) return attention(lq, lk, lv, {}, causal, scale);
    // Queries from position `first` on (a shard of the positions): each sees keys up to its own.
    at::Tensor rows = at::arange(first, first + lq.size(2), lq.options().dtype(at::kLong)).unsqueeze(1);
    at::Tensor cols = at::arange(lk.size(2), lq.options().dtype(at::kLong)).unsqueeze(0);
    return attention(lq, lk, lv, cols <= rows, false, scale);
  });
}

DTensor embedding(const DTensor& table, const DTensor& ids) {
  HP_CHECK(at::isIntegralType(ids.scalar_type(), false))
      << "embedding ids must be integers, got " << ids.scalar_type();
  return dispatch(Op::embedding(), {table, ids}, [](const auto& t, const LocalContext& ctx) {
    auto [first, rows] = local_rows(ctx.inputs[0], ctx.coord);
    if (rows == ctx.inputs[0].shape()[0]) return embedding_lookup(t[0], t[1]);
    // Vocab-sharded: look up the ids this shard holds, zeros for the rest (a partial sum).
    at::Tensor here = both(t[1] >= first, t[1] < first + rows);
    at::Tensor local_ids = (t[1] - first) * here;
    return embedding_lookup(t[0], local_ids) * here.unsqueeze(-1).to(t[0].scalar_type());
  });
}

DTensor view(const DTensor& x, std::vector<int64_t> shape) {
  return dispatch(Op::view(shape), {x}, [](const auto& t, const LocalContext& ctx) {
    return t[0].reshape(ctx.output.local_shape(ctx.coord));
  });
}

DTensor transpose(const DTensor& x, int64_t a, int64_t b) {
  return dispatch(Op::transpose(a, b), {x}, [a, b](const auto& t, const auto&) { return t[0].transpose(a, b); });
}

DTensor permute(const DTensor& x, std::vector<int64_t> dims) {
  return dispatch(Op::permute(dims), {x}, [dims](const auto& t, const auto&) { return t[0].permute(dims); });
}

DTensor flatten(const DTensor& x, int64_t start, int64_t end) {
  if (x.dim() == 0) return view(x, {1});
  start = wrap_dim(x, start, "flatten");
  end = wrap_dim(x, end, "flatten");
  HP_CHECK(start <= end) << "flatten: start dim " << start << " after end dim " << end;
  const auto& s = x.sizes();
  std::vector<int64_t> shape(s.begin(), s.begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= s[d];
  shape.push_back(merged);
  shape.insert(shape.end(), s.begin() + end + 1, s.end());
  return view(x, shape);
}

DTensor unflatten(const DTensor& x, int64_t dim, std::vector<int64_t> sizes) {
  dim = wrap_dim(x, dim, "unflatten");
  const auto& s = x.sizes();
  std::vector<int64_t> shape(s.begin(), s.begin() + dim);
  shape.insert(shape.end(), sizes.begin(), sizes.end());
  shape.insert(shape.end(), s.begin() + dim + 1, s.end());
  return view(x, shape);  // the other dims are fixed, so a -1 can only take dim's share
}

DTensor amax(const DTensor& x, std::vector<int64_t> dims, bool keepdim) {
  if (dims.empty())
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  DeviceMesh mesh = x.device_mesh();
  return dispatch(Op::amax(dims, keepdim), {x}, [dims, keepdim, mesh](const auto& t, const LocalContext& ctx) {
    at::Tensor m = local_amax(t[0], dims, keepdim);
    std::vector<int> partial;
    for (int k = 0; k < mesh.ndim(); ++k)
      if (ctx.output.placement(k).is_partial()) partial.push_back(k);
    if (partial.empty()) return m;
    // The gradient of a P(max) piece is the whole gradient; only the rank whose local max
    // is the global one passes it on to its input.
    at::Tensor value = m.detach();
    return comm::autograd::attach_backward(value.clone(), m, [value, mesh, partial](const at::Tensor& g) {
      at::Tensor global = value;
      for (int k : partial) global = comm::all_reduce(global, mesh.group(k), ReduceOp::Max);
      return g * (value == global).to(g.scalar_type());
    }, "PartialMaxBackward");
  });
}

DTensor cat(const std::vector<DTensor>& tensors, int64_t dim) {
  HP_CHECK(!tensors.empty()) << "cat needs at least one tensor";
  const Op op = Op::cat(dim, static_cast<int>(tensors.size()));
  for (const auto& t : tensors) check_same_dtype(op, tensors[0], t);
  return dispatch(op, tensors, [dim](const auto& t, const auto&) { return at::cat(t, dim); });
}

DTensor narrow(const DTensor& x, int64_t dim, int64_t start, int64_t length) {
  if (start < 0) start += x.size(dim);  // as ATen
  return dispatch(Op::narrow(dim, start, length), {x},
                  [dim, start, length](const auto& t, const auto&) { return t[0].narrow(dim, start, length); });
}

std::vector<DTensor> split(const DTensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  HP_CHECK(!sizes.empty() && total == x.size(dim))
      << "split: sizes " << to_string_list(sizes) << " do not add up to dim " << dim << " of "
      << to_string_list(x.sizes());
  // Every piece asks for the same input layout: redistribute once, then narrow locally.
  auto decision = propagate(Op::narrow(dim, 0, sizes[0]), {x.spec()});
  DTensor whole = x.redistribute(decision->inputs[0].placements());
  std::vector<DTensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(whole, dim, start, s));
    start += s;
  }
  return out;
}

std::vector<DTensor> chunk(const DTensor& x, int64_t n, int64_t dim) {
  HP_CHECK(n > 0) << "chunk: needs a positive number of chunks, got " << n;
  const int64_t size = x.size(dim), step = (size + n - 1) / n;
  if (size == 0) return {x};
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < size; at += step) sizes.push_back(std::min(step, size - at));
  return split(x, sizes, dim);
}

DTensor map(const DTensor& x, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  return dispatch(Op::elementwise(1), {x}, [&fn](const auto& t, const auto&) { return fn(t[0]); });
}

DTensor rms_norm(const DTensor& x, const DTensor& weight, double eps) {
  // Whole rows and a whole weight: one pass per row (fused::rms_norm), under the rule of
  // x * weight, which places the output and reduces the weight's gradient as here.
  bool whole = true;
  for (const Placement& p : x.placements()) whole = whole && !p.is_shard(static_cast<int>(x.dim()) - 1) && !p.is_partial();
  for (const Placement& p : weight.placements()) whole = whole && p.is_replicate();
  if (whole && fused::rms_norm_fusable(x.to_local(), weight.to_local()))
    return dispatch(Op::mul().named("rms_norm"), {x, weight},
                    [eps](const auto& t, const auto&) { return fused::rms_norm(t[0], t[1], eps); });
  DTensor mean_square = mean(mul(x, x), {-1}, /*keepdim=*/true);
  DTensor inv = map(mean_square, [eps](const at::Tensor& t) { return at::rsqrt(t + eps); });
  return mul(mul(x, inv), weight);
}

DTensor swiglu(const DTensor& gate, const DTensor& up) {
  // Same layouts and neither partial (silu is not linear): one pass (fused::swiglu) under
  // the rule of gate * up, which places the output as silu then mul would.
  bool whole = gate.placements() == up.placements();
  for (const Placement& p : gate.placements()) whole = whole && !p.is_partial();
  if (whole && fused::swiglu_fusable(gate.to_local(), up.to_local()))
    return dispatch(Op::mul().named("swiglu"), {gate, up},
                    [](const auto& t, const auto&) { return swiglu_local(t[0], t[1]); });
  return mul(map(gate, [](const at::Tensor& t) { return at::silu(t); }), up);
}

at::Tensor swiglu_local(const at::Tensor& gate, const at::Tensor& up) {
  return fused::swiglu_fusable(gate, up) ? fused::swiglu(gate, up) : at::silu(gate) * up;
}

DTensor layer_norm(const DTensor& x, const DTensor& weight, const DTensor& bias, double eps) {
  DTensor centered = sub(x, mean(x, {-1}, /*keepdim=*/true));
  DTensor var = mean(mul(centered, centered), {-1}, /*keepdim=*/true);
  DTensor inv = map(var, [eps](const at::Tensor& t) { return at::rsqrt(t + eps); });
  return add(mul(mul(centered, inv), weight), bias);
}

DTensor cross_entropy(const DTensor& logits_in, const DTensor& targets_in) {
  const int64_t vocab_dim = logits_in.dim() - 1;
  bool shapes_ok = logits_in.dim() >= 2 && targets_in.dim() == vocab_dim;
  for (int64_t d = 0; shapes_ok && d < vocab_dim; ++d) shapes_ok = logits_in.size(d) == targets_in.size(d);
  HP_CHECK(shapes_ok) << "cross_entropy expects logits [..., V] and targets [...] of the same leading shape, got "
                      << to_string_list(logits_in.sizes()) << " and " << to_string_list(targets_in.sizes());
  const DeviceMesh& mesh = logits_in.device_mesh();
  HP_CHECK(targets_in.device_mesh() == mesh) << "cross_entropy: logits on " << mesh.to_string()
                                             << " but targets on " << targets_in.device_mesh().to_string();
  // Keep row and vocabulary shards; anything else (Partial) is settled first.
  std::vector<Placement> lp, tp;
  std::vector<int> vocab_dims, row_dims;
  for (int k = 0; k < mesh.ndim(); ++k) {
    const Placement& p = logits_in.placements()[k];
    if (p.is_shard(static_cast<int>(vocab_dim))) {
      lp.push_back(p), tp.push_back(Replicate()), vocab_dims.push_back(k);
    } else if (p.is_shard()) {
      lp.push_back(p), tp.push_back(p), row_dims.push_back(k);
    } else {
      lp.push_back(Replicate()), tp.push_back(Replicate());
    }
  }
  DTensor logits = logits_in.redistribute(lp);
  DTensor targets = targets_in.redistribute(tp);
  const std::vector<int64_t> coord = mesh.coordinate();
  const at::Tensor& z = logits.to_local();
  const at::Tensor& t = targets.to_local();
  const int64_t first = logits.spec().global_offset(coord)[vocab_dim];
  const int64_t cols = z.size(-1);

  // Stable log-sum-exp across vocabulary shards: the max needs no gradient.
  // An empty vocabulary piece (uneven shards) holds no candidate: the lowest value.
  at::Tensor m = cols > 0 ? std::get<0>(z.detach().max(-1, /*keepdim=*/true))
                          : at::full(t.unsqueeze(-1).sizes(), -std::numeric_limits<double>::infinity(), z.options());
  for (int k : vocab_dims) m = comm::all_reduce(m, mesh.group(k), ReduceOp::Max);
  at::Tensor sum_exp = (z - m).exp().sum(-1);
  at::Tensor here = both(t >= first, t < first + cols);
  at::Tensor target_logit = gather_last(z, ((t - first) * here).unsqueeze(-1)).squeeze(-1) * here.to(z.scalar_type());
  for (int k : vocab_dims) {
    // Partial sums over the shards; the gradient of each term is the whole gradient.
    sum_exp = comm::autograd::all_reduce_sum(sum_exp, mesh.group(k));
    target_logit = comm::autograd::all_reduce_sum(target_logit, mesh.group(k));
  }
  at::Tensor total = (sum_exp.log() + m.squeeze(-1) - target_logit).sum();
  for (int k : row_dims) total = comm::autograd::all_reduce_sum(total, mesh.group(k));
  int64_t rows = 1;
  for (int64_t d = 0; d < vocab_dim; ++d) rows *= logits.size(d);
  at::Tensor loss = total / static_cast<double>(rows);
  return DTensor(loss, mesh, make_spec({}, loss.scalar_type(), mesh, std::vector<Placement>(mesh.ndim(), Replicate())));
}

}  // namespace hp
