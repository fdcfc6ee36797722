#include "hp/optim/muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <queue>
#include <utility>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/collectives.h"

namespace hp::optim {
namespace {

// A rectangle of a matrix: where it starts and its extent, per dim.
struct Box {
  std::array<int64_t, 2> offset{0, 0}, shape{0, 0};
  int64_t numel() const { return shape[0] * shape[1]; }
};

Box intersect(const Box& a, const Box& b) {
  Box r;
  for (int d = 0; d < 2; ++d) {
    r.offset[d] = std::max(a.offset[d], b.offset[d]);
    r.shape[d] = std::max<int64_t>(0, std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]) - r.offset[d]);
  }
  return r;
}

// The part `box` of `t`, a tensor that holds the part `held` of the matrix.
at::Tensor part(const at::Tensor& t, const Box& held, const Box& box) {
  return t.narrow(0, box.offset[0] - held.offset[0], box.shape[0]).narrow(1, box.offset[1] - held.offset[1], box.shape[1]);
}

// Flops of one Newton-Schulz iteration on an n x m matrix in its wide form (n <= m): the
// Gram matrix x x^T, its square and the product with x. Split over `ranks`, the square
// is computed by every rank, the rest shared.
double ns_cost(const std::vector<int64_t>& s, int ranks = 1) {
  const double n = double(std::min(s[0], s[1])), m = double(std::max(s[0], s[1]));
  return 4 * n * n * m / ranks + 2 * n * n * n;
}

// How many of the costliest matrices (`order`, costliest first) to split so that the
// busiest of `n` ranks works least: the split ones' cost shared by all, the rest placed
// greedily on the least loaded rank. Ties go to fewer splits, which communicate less.
size_t balanced_splits(const std::vector<std::vector<int64_t>>& shapes, const std::vector<size_t>& order, int n) {
  size_t best = 0;
  double best_span = 0, shared = 0;
  for (size_t k = 0; k <= order.size(); ++k) {
    if (k > 0) shared += ns_cost(shapes[order[k - 1]], n);
    std::priority_queue<double, std::vector<double>, std::greater<double>> load;
    for (int r = 0; r < n; ++r) load.push(0);
    double span = 0;
    for (size_t i = k; i < order.size(); ++i) {
      const double l = load.top() + ns_cost(shapes[order[i]]);
      load.pop();
      load.push(l);
      span = std::max(span, l);
    }
    if (k == 0 || shared + span < best_span * (1 - 1e-9)) best = k, best_span = shared + span;
  }
  return best;
}

// Indices of `shapes` (global, of matrices), the costliest first.
std::vector<size_t> costliest_first(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<size_t> order(shapes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return ns_cost(shapes[x]) > ns_cost(shapes[y]); });
  return order;
}

// The global shapes of the entries `params` of `all`.
std::vector<std::vector<int64_t>> global_shapes(const std::vector<DTensor*>& all, const std::vector<size_t>& params) {
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i : params) shapes.push_back(all[i]->spec().shape());
  return shapes;
}

// Per entry of the matrices on one mesh of `n` ranks (`params` of `all`, with their
// `shapes` and costliest-first `order`), whether it goes in blocks to every rank rather
// than whole to one (MuonOptions::split).
std::vector<char> in_blocks(const std::vector<DTensor*>& all, const std::vector<size_t>& params,
                            const std::vector<std::vector<int64_t>>& shapes, const std::vector<size_t>& order, int n,
                            const MuonOptions& o) {
  const size_t E = params.size();
  std::vector<char> out(E, 0);
  if (n == 1 || o.split == MuonSplit::None) return out;
  if (o.split == MuonSplit::All) {
    out.assign(E, 1);
  } else if (o.split == MuonSplit::Listed) {
    for (size_t e = 0; e < E; ++e)
      out[e] = std::find(o.split_params.begin(), o.split_params.end(), all[params[e]]) != o.split_params.end();
  } else {
    const size_t k = balanced_splits(shapes, order, n);
    for (size_t i = 0; i < k; ++i) out[order[i]] = 1;
  }
  return out;
}

// The indices of `params` per mesh (by its description), and the meshes.
std::map<std::string, std::pair<DeviceMesh, std::vector<size_t>>> by_mesh(const std::vector<DTensor*>& params) {
  std::map<std::string, std::pair<DeviceMesh, std::vector<size_t>>> out;
  for (size_t i = 0; i < params.size(); ++i)
    out.try_emplace(params[i]->device_mesh().to_string(), params[i]->device_mesh(), std::vector<size_t>())
        .first->second.second.push_back(i);
  return out;
}

}  // namespace

// The parameters on one mesh and who orthogonalises what: a matrix goes whole to an owner
// (the costliest first, each to the least loaded rank), or in blocks of its long side to
// every rank (MuonOptions::split). All-to-alls move the data: each piece of each momentum
// update to the ranks whose work region it meets, each result back to the ranks that hold
// it, one pair per round (make_rounds). Split sizes are fixed by the layouts.
struct Muon::Exchange {
  using Update = std::function<at::Tensor(size_t entry)>;  // the local momentum update
  using Apply = std::function<void(size_t entry, const at::Tensor& result)>;  // the local result
  DeviceMesh mesh;
  const comm::Group* group;
  std::vector<size_t> params;
  std::vector<int> owner;                 // per entry; -1: split over every rank
  std::vector<std::vector<int64_t>> shapes;  // global, per entry
  std::vector<std::vector<Box>> piece;    // [entry][group rank]: what the rank holds
  std::vector<std::vector<char>> sender;  // [entry][group rank]: replicated pieces are sent once
  std::vector<std::vector<Box>> work;     // [entry][group rank]: what the rank orthogonalises
  std::vector<size_t> assignment_order;   // entries, the costliest first
  std::vector<std::vector<size_t>> rounds;  // entries exchanged and computed together
  struct Counts {
    std::vector<int64_t> send, recv;  // elements to and from each rank
  };
  std::vector<Counts> to_work, back;        // per round: all-to-all sizes

  Exchange(const DeviceMesh& m, const std::vector<DTensor*>& all, std::vector<size_t> idx, const MuonOptions& o)
      : mesh(m), group(&m.whole_group()), params(std::move(idx)) {
    const int n = group->size();
    const size_t E = params.size();
    shapes = global_shapes(all, params);
    const std::vector<size_t> order = costliest_first(shapes);
    const std::vector<char> split = in_blocks(all, params, shapes, order, n, o);
    std::vector<double> load(n, 0);
    owner.assign(E, -1);
    for (size_t e : order) {
      if (split[e]) continue;
      owner[e] = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[owner[e]] += ns_cost(shapes[e]);
    }
    for (size_t e = 0; e < E; ++e) {
      const ShardSpec& spec = all[params[e]]->spec();
      const Box whole{{0, 0}, {shapes[e][0], shapes[e][1]}};
      piece.emplace_back(n), sender.emplace_back(n, 1), work.emplace_back(n);
      for (int r = 0; r < n; ++r) {
        std::vector<int64_t> coord = mesh.shape().coord_of(group->global_rank(r));
        const std::vector<int64_t> offset = spec.global_offset(coord), shape = spec.local_shape(coord);
        piece[e][r] = Box{{offset[0], offset[1]}, {shape[0], shape[1]}};
        for (int k = 0; k < mesh.ndim(); ++k)
          sender[e][r] = sender[e][r] && (spec.placement(k).is_shard() || coord[k] == 0);
      }
      if (owner[e] >= 0) {
        work[e][owner[e]] = whole;
        continue;
      }
      // Blocks of the long side, as even as they go: the Gram matrices of the short side
      // are summed over the ranks, everything else stays local.
      const int d = shapes[e][0] > shapes[e][1] ? 0 : 1;
      const int64_t len = shapes[e][d];
      int64_t at_ = 0;
      for (int r = 0; r < n; ++r) {
        Box b = whole;
        b.offset[d] = at_;
        b.shape[d] = len / n + (r < len % n ? 1 : 0);
        at_ += b.shape[d];
        work[e][r] = b;
      }
    }
    assignment_order = order;
    make_rounds(o.overlap);
  }

  // Elements this rank sends to and receives from each rank, moving `entries` to their
  // work regions (to_work) or their results back to the holders.
  Counts counts(const std::vector<size_t>& entries, bool to_work) const {
    const int n = group->size(), me = group->rank();
    Counts c{std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0)};
    for (size_t e : entries)
      for (int r = 0; r < n; ++r) {
        if (to_work) {
          if (sender[e][me]) c.send[r] += intersect(piece[e][me], work[e][r]).numel();
          if (sender[e][r]) c.recv[r] += intersect(piece[e][r], work[e][me]).numel();
        } else {
          c.send[r] += intersect(work[e][me], piece[e][r]).numel();
          c.recv[r] += intersect(work[e][r], piece[e][me]).numel();
        }
      }
    return c;
  }

  // Which matrices travel and are computed together. Overlapped: round k holds the k-th
  // matrix of every owner (the costliest first), the split ones join round 0; each round's
  // results go back while the next round is computed. Otherwise one round of everything.
  void make_rounds(bool overlap) {
    std::vector<int> taken(group->size(), 0);
    for (size_t e : assignment_order) {
      const size_t k = !overlap || owner[e] < 0 ? 0 : taken[owner[e]]++;
      if (rounds.size() <= k) rounds.resize(k + 1);
      rounds[k].push_back(e);
    }
    for (auto& r : rounds) std::sort(r.begin(), r.end());
    for (const auto& r : rounds) to_work.push_back(counts(r, true)), back.push_back(counts(r, false));
  }

  // One all-to-all, returned at once (its Pending gives what arrived).
  static comm::Pending all_to_all(std::vector<at::Tensor> parts, const Counts& c, const comm::Group& g,
                                  const at::TensorOptions& options) {
    at::Tensor send = parts.empty() ? at::empty({0}, options) : at::cat(parts);
    at::Tensor recv = at::empty({std::accumulate(c.recv.begin(), c.recv.end(), int64_t{0})}, options);
    return comm::all_to_all_single_async(recv, send, g, c.recv, c.send);
  }

  // Sends the pieces of round k's momentum updates (`update(e)`, made here and dropped once
  // packed) to the ranks that work on them.
  comm::Pending send_to_work(size_t k, const Update& update, const at::TensorOptions& options) const {
    const int n = group->size(), me = group->rank();
    std::vector<at::Tensor> local(params.size());
    for (size_t e : rounds[k]) local[e] = update(e);
    std::vector<at::Tensor> out;  // destination-major, entries in order
    for (int d = 0; d < n; ++d)
      for (size_t e : rounds[k]) {
        const Box b = intersect(piece[e][me], work[e][d]);
        if (sender[e][me] && b.numel()) out.push_back(part(local[e], piece[e][me], b).reshape({-1}));
      }
    return all_to_all(std::move(out), to_work[k], *group, options);
  }

  // Round k's work regions of this rank, from what send_to_work delivered.
  void receive_work(size_t k, const at::Tensor& got, std::vector<at::Tensor>& region) const {
    const int n = group->size(), me = group->rank();
    for (size_t e : rounds[k]) region[e] = at::empty({work[e][me].shape[0], work[e][me].shape[1]}, got.options());
    int64_t at_ = 0;
    for (int r = 0; r < n; ++r)
      for (size_t e : rounds[k]) {
        const Box b = intersect(piece[e][r], work[e][me]);
        if (!sender[e][r] || !b.numel()) continue;
        part(region[e], work[e][me], b).copy_(got.narrow(0, at_, b.numel()).view({b.shape[0], b.shape[1]}));
        at_ += b.numel();
      }
  }

  // Round k on this rank: its whole matrices, then the split ones together, in blocks of
  // their wide form.
  void compute(size_t k, const std::vector<at::Tensor>& region, std::vector<at::Tensor>& ortho,
               at::ScalarType dtype, const MuonOptions& o) const {
    const int me = group->rank();
    std::vector<at::Tensor> blocks;
    std::vector<size_t> split;
    auto wide = [&](size_t e, const at::Tensor& t) { return shapes[e][0] > shapes[e][1] ? t.t() : t; };
    for (size_t e : rounds[k]) {
      if (owner[e] == me) ortho[e] = newton_schulz(region[e], o.ns_steps, o.ns_dtype);
      if (owner[e] >= 0) continue;
      split.push_back(e);
      blocks.push_back(wide(e, region[e]));
    }
    if (!split.empty()) {
      std::vector<at::Tensor> done = newton_schulz_blocks(std::move(blocks), o.ns_steps, *group, o.ns_dtype);
      for (size_t i = 0; i < split.size(); ++i) ortho[split[i]] = wide(split[i], done[i]);  // transposing back
    }
    for (size_t e : rounds[k])
      if (ortho[e].defined())
        ortho[e] = ortho[e].to(dtype) * std::sqrt(std::max(1.0, double(shapes[e][0]) / double(shapes[e][1])));
  }

  // Sends the pieces of round k's results to the ranks that hold them.
  comm::Pending send_back(size_t k, const std::vector<at::Tensor>& ortho, const at::TensorOptions& options) const {
    const int n = group->size(), me = group->rank();
    std::vector<at::Tensor> out;
    for (int d = 0; d < n; ++d)
      for (size_t e : rounds[k]) {
        const Box b = intersect(work[e][me], piece[e][d]);
        if (b.numel()) out.push_back(part(ortho[e], work[e][me], b).reshape({-1}));
      }
    return all_to_all(std::move(out), back[k], *group, options);
  }

  // This rank's pieces of round k's results, from what send_back delivered, each handed to
  // `apply` as soon as it is whole.
  void receive_back(size_t k, const at::Tensor& got, const at::TensorOptions& options, const Apply& apply) const {
    const int n = group->size(), me = group->rank();
    std::vector<at::Tensor> result(params.size());
    for (size_t e : rounds[k]) result[e] = at::empty({piece[e][me].shape[0], piece[e][me].shape[1]}, options);
    int64_t at_ = 0;
    for (int o = 0; o < n; ++o)
      for (size_t e : rounds[k]) {
        const Box b = intersect(work[e][o], piece[e][me]);
        if (!b.numel()) continue;
        part(result[e], piece[e][me], b).copy_(got.narrow(0, at_, b.numel()).view({b.shape[0], b.shape[1]}));
        at_ += b.numel();
      }
    for (size_t e : rounds[k]) apply(e, result[e]);
  }

  // Orthogonalises the local updates (`update(e)`) and hands each local result to `apply`.
  // Every round's momentum pieces are sent at once; round k is computed as soon as its
  // pieces are there, and its results go back while round k + 1 is computed. Each matrix's
  // arithmetic is the same in any round. What a round is done with is dropped, so the step
  // holds the exchange's buffers and one round's work, not copies of every matrix. One rank
  // exchanges nothing: it takes the matrices one by one.
  void orthogonalise(const Update& update, const Apply& apply, const at::TensorOptions& options,
                     const MuonOptions& o) const {
    const size_t E = params.size();
    std::vector<at::Tensor> region(E), ortho(E);
    if (group->size() == 1) {
      for (size_t k = 0; k < rounds.size(); ++k) {
        for (size_t e : rounds[k]) region[e] = update(e);
        compute(k, region, ortho, options.dtype().toScalarType(), o);
        for (size_t e : rounds[k]) {
          apply(e, ortho[e]);
          region[e] = ortho[e] = at::Tensor();
        }
      }
      return;
    }
    std::vector<comm::Pending> incoming, outgoing;
    for (size_t k = 0; k < rounds.size(); ++k) incoming.push_back(send_to_work(k, update, options));
    for (size_t k = 0; k < rounds.size(); ++k) {
      receive_work(k, std::exchange(incoming[k], comm::Pending()).wait(), region);
      compute(k, region, ortho, options.dtype().toScalarType(), o);
      outgoing.push_back(send_back(k, ortho, options));
      for (size_t e : rounds[k]) region[e] = ortho[e] = at::Tensor();  // packed: done with them
    }
    for (size_t k = 0; k < rounds.size(); ++k)
      receive_back(k, std::exchange(outgoing[k], comm::Pending()).wait(), options, apply);
  }
};

std::vector<const DTensor*> muon_split_params(const std::vector<DTensor*>& params, const MuonOptions& options) {
  std::vector<const DTensor*> out;
  for (const auto& [key, mesh_params] : by_mesh(params)) {
    const auto& [mesh, idx] = mesh_params;
    const std::vector<std::vector<int64_t>> shapes = global_shapes(params, idx);
    const std::vector<char> split =
        in_blocks(params, idx, shapes, costliest_first(shapes), mesh.whole_group().size(), options);
    for (size_t e = 0; e < idx.size(); ++e)
      if (split[e]) out.push_back(params[idx[e]]);
  }
  return out;
}

Muon::Muon(std::vector<DTensor*> params, MuonOptions options) : params_(std::move(params)), options_(options) {
  HP_CHECK(options_.ns_dtype == at::kFloat || options_.ns_dtype == at::kBFloat16)
      << "Muon: ns_dtype is " << options_.ns_dtype << "; the Newton-Schulz iteration runs in float32 or bfloat16";
  for (size_t i = 0; i < params_.size(); ++i) {
    DTensor* p = params_[i];
    HP_CHECK(p->dim() == 2) << "Muon: parameter " << i << " has shape " << to_string_list(p->sizes())
                            << "; Muon takes 2-D weights (give the others to AdamW)";
    HP_CHECK(!awaits_init(*p)) << not_drawn_yet("Muon: parameter " + std::to_string(i), "before making the optimizer");
    for (const Placement& pl : p->placements())
      HP_CHECK(!pl.is_partial()) << "Muon: parameter " << i << " is Partial: " << p->spec().to_string();
    momentum_.push_back(at::zeros_like(p->to_local()));
  }
  for (auto& [key, mesh_params] : by_mesh(params_))
    exchanges_.push_back(std::make_unique<Exchange>(mesh_params.first, params_, mesh_params.second, options_));
}

Muon::~Muon() = default;

int Muon::owner(size_t param_index) const {
  for (const auto& ex : exchanges_)
    for (size_t e = 0; e < ex->params.size(); ++e)
      if (ex->params[e] == param_index) return ex->owner[e];
  HP_FAIL() << "Muon: no parameter " << param_index;
  return -1;
}

void Muon::step() {
  at::NoGradGuard no_grad;
  ++step_;
  const auto& o = options_;
  for (auto& ex : exchanges_) {
    // Momentum first, for every matrix; each update is made when its round is sent.
    std::vector<at::Tensor> grads;
    for (size_t i : ex->params) {
      at::Tensor g = resident_local(params_, i, "Muon").grad();
      if (!g.defined()) g = at::zeros_like(momentum_[i]);  // every rank takes part in the exchange
      momentum_[i].mul_(o.momentum).add_(g);
      grads.push_back(g);
    }
    auto update = [&](size_t e) {
      const at::Tensor& m = momentum_[ex->params[e]];
      at::Tensor g = std::exchange(grads[e], at::Tensor());
      return o.nesterov ? g + o.momentum * m : m.clone();
    };
    auto apply = [&](size_t e, const at::Tensor& ortho) {
      at::Tensor p = params_[ex->params[e]]->to_local();
      if (p.grad().defined()) p.mul_(1 - o.lr * o.weight_decay).add_(ortho, -o.lr);
    };
    ex->orthogonalise(update, apply, momentum_[ex->params[0]].options(), o);
  }
}

std::vector<StateEntry> Muon::state() {
  std::vector<StateEntry> out;
  for (size_t i = 0; i < params_.size(); ++i) out.push_back({params_[i], "momentum", &momentum_[i]});
  return out;
}

}  // namespace hp::optim
