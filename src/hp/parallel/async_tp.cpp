#include "hp/parallel/async_tp.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <optional>
#include <utility>

#include "hp/comm/autograd.h"
#include "hp/comm/collectives.h"
#include "hp/comm/trace.h"
#include "hp/layout/sharding_propagation.h"
#include "hp/parallel/tensor_parallel.h"
#include "hp/tensor/ops.h"

namespace hp {
namespace {

constexpr int kPieceTag = 25;  // point-to-point tag of the sequence pieces

// Extent and offset along the sequence of every tensor-parallel rank's piece of `spec`.
struct Pieces {
  std::vector<int64_t> sizes, offsets;
  int rank = 0;
  int count() const { return static_cast<int>(sizes.size()); }
};

Pieces pieces_of(const ShardSpec& spec, const DeviceMesh& mesh, int tp_dim, int seq_dim) {
  std::vector<int64_t> coord = mesh.coordinate();
  Pieces p;
  p.rank = static_cast<int>(coord[tp_dim]);
  int64_t offset = 0;
  for (int64_t i = 0; i < mesh.size(tp_dim); ++i) {
    coord[tp_dim] = i;
    p.sizes.push_back(spec.local_shape(coord)[seq_dim]);
    p.offsets.push_back(offset);
    offset += p.sizes.back();
  }
  return p;
}

// `t` with extent `n` along `dim`.
std::vector<int64_t> with_extent(at::IntArrayRef sizes, int64_t dim, int64_t n) {
  std::vector<int64_t> s = sizes.vec();
  s[dim] = n;
  return s;
}

// The gradient rules dispatch() applies on mesh dims other than the tensor-parallel one:
// a replicated input meeting a split output has its per-rank gradients summed (unless a
// data-parallel wrapper does it later). Empty when the combination is one dispatch()
// scales instead (then the ordinary path runs).
std::optional<at::Tensor> with_other_dims_gradients(const DTensor& input, const ShardSpec& out, int tp_dim) {
  at::Tensor x = input.to_local();
  const DeviceMesh& mesh = input.device_mesh();
  for (int k = 0; k < mesh.ndim(); ++k) {
    if (k == tp_dim || !input.spec().placement(k).is_replicate() || !x.requires_grad()) continue;
    const bool replicated_out = out.placement(k).is_replicate(), deferred = input.defers_grad_reduction(k);
    if (replicated_out && deferred) return std::nullopt;
    if (!replicated_out && !deferred) x = comm::autograd::all_reduce_sum_backward(x, mesh.group(k));
  }
  return x;
}

// A graph node with two inputs (the Linear's input and weight) run by a closure.
struct LinearPiecesBackward : torch::autograd::Node {
  std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor&)> fn;
  std::string label;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    auto [gx, gw] = fn(grads[0]);
    return {gx, gw};
  }
  std::string name() const override { return label; }
};

at::Tensor attach_linear_backward(at::Tensor out, const at::Tensor& x, const at::Tensor& w,
                                  std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor&)> backward,
                                  const char* name) {
  if (!at::GradMode::is_enabled() || (!x.requires_grad() && !w.requires_grad())) return out;
  auto node = std::shared_ptr<LinearPiecesBackward>(new LinearPiecesBackward(), torch::autograd::deleteNode);
  node->fn = std::move(backward);
  node->label = name;
  node->set_next_edges(torch::autograd::collect_next_edges(x, w));
  torch::autograd::set_history(out, node);
  return out;
}

// Every rank's piece of a sequence-sharded tensor: this rank's sent to every peer at once,
// each peer's received into a buffer of its own, waited for only when it is used.
class Exchange {
 public:
  Exchange(const at::Tensor& mine, const comm::Group& g, const Pieces& p, int64_t seq_dim)
      : pieces_(p.count()), recvs_(p.count()) {
    pieces_[p.rank] = mine.contiguous();
    for (int r = 0; r < p.count(); ++r) {
      if (r == p.rank) continue;
      pieces_[r] = at::empty(with_extent(mine.sizes(), seq_dim, p.sizes[r]), mine.options());
      if (pieces_[r].numel() > 0) recvs_[r] = comm::recv_async(pieces_[r], g, r, kPieceTag);
      if (mine.numel() > 0) sends_.push_back(comm::send_async(pieces_[p.rank], g, r, kPieceTag));
    }
  }
  ~Exchange() {
    // An exception between posting and waiting must not leave buffers in flight.
    for (auto& s : sends_)
      if (!s.ready()) try {
          s.wait();
        } catch (...) {
        }
  }
  const at::Tensor& piece(int r) {
    if (recvs_[r]) {
      recvs_[r]->wait();
      recvs_[r].reset();
    }
    return pieces_[r];
  }
  void finish() {
    for (auto& s : sends_) s.wait();
    sends_.clear();
  }

 private:
  std::vector<at::Tensor> pieces_;
  std::vector<std::optional<comm::Pending>> recvs_;
  std::vector<comm::Pending> sends_;
};

// Ranks in the order their pieces are used: this rank's (already here) first, then the
// others from the next one on.
std::vector<int> from_mine(const Pieces& p) {
  std::vector<int> order;
  for (int i = 0; i < p.count(); ++i) order.push_back((p.rank + i) % p.count());
  return order;
}

// The gathered input of the last all-gather on this thread (ranks run as threads), so that
// Linears reading one input (q, k, v) gather it once. Holding `key` keeps its identity
// from being reused by another tensor while the entry lives.
struct Gathered {
  at::Tensor key, full;
  int64_t version = -1;
  const comm::Group* group = nullptr;
  int64_t seq_dim = -1;
};
thread_local Gathered last_gathered;

// all-gather + matmul on local tensors: xs [.., s_r, .., in] this rank's sequence piece,
// w [out_r, in]. Returns y [.., S, .., out_r] and the gathered input.
// `key`: the input as the caller holds it (the cache's key).
std::pair<at::Tensor, at::Tensor> gather_and_multiply(const at::Tensor& key, const at::Tensor& xs, const at::Tensor& w,
                                                      const comm::Group& g, const Pieces& p, int64_t seq_dim) {
  at::NoGradGuard no_grad;
  Gathered& cached = last_gathered;
  if (cached.key.defined() && cached.key.is_same(key) && cached.version == key._version() && cached.group == &g &&
      cached.seq_dim == seq_dim)
    return {at::linear(cached.full, w), cached.full};
  const int64_t total = p.offsets.back() + p.sizes.back();
  at::Tensor full = at::empty(with_extent(xs.sizes(), seq_dim, total), xs.options());
  std::vector<at::Tensor> ys(p.count());
  Exchange ex(xs, g, p, seq_dim);
  for (int r : from_mine(p)) {
    const at::Tensor& piece = ex.piece(r);
    full.narrow(seq_dim, p.offsets[r], p.sizes[r]).copy_(piece);
    trace::Span span("compute", trace::enabled() ? "matmul piece " + std::to_string(r) : std::string());
    ys[r] = at::linear(piece, w);
  }
  ex.finish();
  cached = Gathered{key, full, key._version(), &g, seq_dim};
  return {at::cat(ys, seq_dim), full};
}

// matmul + reduce-scatter on local tensors: x [.., S, .., in_r], w [out, in_r]. Returns
// this rank's piece of the sum over ranks of x w^T.
at::Tensor multiply_and_scatter(const at::Tensor& x, const at::Tensor& w, const comm::Group& g, const Pieces& p,
                                int64_t seq_dim) {
  at::NoGradGuard no_grad;
  const int n = p.count();
  std::vector<int64_t> mine_shape = with_extent(x.sizes(), seq_dim, p.sizes[p.rank]);
  mine_shape.back() = w.size(0);
  std::vector<at::Tensor> parts(n);
  std::vector<std::optional<comm::Pending>> recvs(n);
  for (int r = 0; r < n; ++r) {
    if (r == p.rank) continue;
    parts[r] = at::empty(mine_shape, x.options());
    if (parts[r].numel() > 0) recvs[r] = comm::recv_async(parts[r], g, r, kPieceTag);
  }
  std::vector<comm::Pending> sends;
  for (int i = 1; i <= n; ++i) {  // the next rank's rows first, this rank's last
    const int r = (p.rank + i) % n;
    trace::Span span("compute", trace::enabled() ? "matmul rows for " + std::to_string(r) : std::string());
    at::Tensor rows = at::linear(x.narrow(seq_dim, p.offsets[r], p.sizes[r]).contiguous(), w);
    if (r == p.rank) parts[r] = rows;
    else if (rows.numel() > 0) sends.push_back(comm::send_async(rows, g, r, kPieceTag));
  }
  for (auto& r : recvs)
    if (r) r->wait();
  for (auto& s : sends) s.wait();
  // In rank order, as the reduce-scatter it replaces folds (float32 for 16-bit floats).
  const bool widen = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  at::Tensor sum = widen ? parts[0].to(at::kFloat) : parts[0].clone();
  for (int r = 1; r < n; ++r) sum.add_(parts[r]);
  return widen ? sum.to(x.scalar_type()) : sum;
}

// `spec` with tensor-parallel placement `p`.
ShardSpec placed(const ShardSpec& spec, int tp_dim, Placement p) {
  return spec.with_placements(with_placement(spec.placements(), tp_dim, p));
}

bool is_meta(const DTensor& t) { return t.to_local().is_meta(); }

DTensor gathered_product(const DTensor& x, const DTensor& weight, int tp_dim, int seq_dim) {
  const DeviceMesh& mesh = x.device_mesh();
  const ShardSpec x_full = placed(x.spec(), tp_dim, Replicate());
  auto ordinary = [&] { return linear(x.redistribute(x_full.placements()), weight); };
  if (!x.spec().placement(tp_dim).is_shard(seq_dim) || x.spec().mesh_dims_sharding(seq_dim).size() != 1 ||
      is_meta(x) || mesh.size(tp_dim) == 1)
    return ordinary();
  auto decision = propagate(Op::linear(), {x_full, weight.spec()});
  if (decision->inputs[0] != x_full || decision->inputs[1] != weight.spec() ||
      !decision->output.placement(tp_dim).is_shard(static_cast<int>(x.dim() - 1)))
    return ordinary();
  auto xs = with_other_dims_gradients(x, decision->output, tp_dim);
  auto w = with_other_dims_gradients(weight, decision->output, tp_dim);
  if (!xs || !w) return ordinary();

  const comm::Group& g = mesh.group(tp_dim);
  const Pieces p = pieces_of(x.spec(), mesh, tp_dim, seq_dim);
  auto [y, full] = gather_and_multiply(x.to_local(), *xs, *w, g, p, seq_dim);
  const bool need_x = xs->requires_grad(), need_w = w->requires_grad();
  y = attach_linear_backward(
      y, *xs, *w,
      [&g, full = full, w = w->detach(), sizes = p.sizes, seq_dim, need_x, need_w](const at::Tensor& grad) {
        // As at::linear's backward computes them (mm on rows), the input gradient's
        // reduce-scatter in flight while the weight gradient is computed.
        const at::Tensor g2 = grad.reshape({-1, grad.size(-1)});
        std::optional<comm::Pending> scatter;
        if (need_x)
          scatter = comm::reduce_scatter_async(g2.mm(w).view(full.sizes()), g, seq_dim, ReduceOp::Sum, sizes);
        at::Tensor gw = need_w ? g2.t().mm(full.reshape({-1, full.size(-1)})) : at::Tensor();
        return std::make_pair(scatter ? scatter->wait() : at::Tensor(), gw);
      },
      "AllGatherLinearBackward");
  return DTensor(y, mesh, decision->output);
}

DTensor scattered_product(const DTensor& x, const DTensor& weight, int tp_dim, int seq_dim) {
  const DeviceMesh& mesh = x.device_mesh();
  auto ordinary = [&] { return linear(x, weight); };  // the style's output hook reduce-scatters
  if (!x.spec().mesh_dims_sharding(seq_dim).empty() || is_meta(x) || mesh.size(tp_dim) == 1) return ordinary();
  auto decision = propagate(Op::linear(), {x.spec(), weight.spec()});
  if (decision->inputs[0] != x.spec() || decision->inputs[1] != weight.spec() ||
      decision->output.placement(tp_dim) != Partial(ReduceOp::Sum))
    return ordinary();
  const ShardSpec out = placed(decision->output, tp_dim, Shard(seq_dim));
  if (out.has_partial()) return ordinary();
  auto xl = with_other_dims_gradients(x, decision->output, tp_dim);
  auto w = with_other_dims_gradients(weight, decision->output, tp_dim);
  if (!xl || !w) return ordinary();

  const comm::Group& g = mesh.group(tp_dim);
  const Pieces p = pieces_of(out, mesh, tp_dim, seq_dim);
  at::Tensor y = multiply_and_scatter(*xl, *w, g, p, seq_dim);
  const bool need_x = xl->requires_grad(), need_w = w->requires_grad();
  y = attach_linear_backward(
      y, *xl, *w,
      [&g, x = xl->detach(), w = w->detach(), p, seq_dim, need_x, need_w](const at::Tensor& grad) {
        // The output gradient's pieces gathered; the input gradient's rows of each piece
        // computed as it arrives (as at::linear's backward computes them: mm on rows).
        at::NoGradGuard no_grad;
        const int64_t out_features = grad.size(-1);
        std::vector<at::Tensor> grads(p.count()), gx(p.count());
        Exchange ex(grad, g, p, seq_dim);
        for (int r : from_mine(p)) {
          grads[r] = ex.piece(r);
          if (need_x) gx[r] = grads[r].reshape({-1, out_features}).mm(w).view(
                          with_extent(x.sizes(), seq_dim, p.sizes[r]));
        }
        ex.finish();
        const at::Tensor full = at::cat(grads, seq_dim);
        at::Tensor gw = need_w ? full.reshape({-1, out_features}).t().mm(x.reshape({-1, x.size(-1)})) : at::Tensor();
        return std::make_pair(need_x ? at::cat(gx, seq_dim) : at::Tensor(), gw);
      },
      "LinearReduceScatterBackward");
  return DTensor(y, mesh, out);
}

// Named types, so that is_async_tp_product can recognise them.
struct GatheredProduct {
  int tp_dim, seq_dim;
  DTensor operator()(const DTensor& x, const DTensor& w) const { return gathered_product(x, w, tp_dim, seq_dim); }
};
struct ScatteredProduct {
  int tp_dim, seq_dim;
  DTensor operator()(const DTensor& x, const DTensor& w) const { return scattered_product(x, w, tp_dim, seq_dim); }
};

}  // namespace

nn::Linear::Product all_gather_linear(int tp_dim, int seq_dim) { return GatheredProduct{tp_dim, seq_dim}; }

nn::Linear::Product linear_reduce_scatter(int tp_dim, int seq_dim) { return ScatteredProduct{tp_dim, seq_dim}; }

bool is_async_tp_product(const nn::Linear::Product& product) {
  return product.target<GatheredProduct>() != nullptr || product.target<ScatteredProduct>() != nullptr;
}

}  // namespace hp
