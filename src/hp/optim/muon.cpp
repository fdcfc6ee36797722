#include "hp/optim/muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/collectives.h"

namespace hp::optim {
namespace {

// Rank `coord`'s piece of a parameter: where it sits in the matrix, and whether this rank
// is the one that sends it (pieces replicated over mesh dims are sent once).
struct Piece {
  std::vector<int64_t> offset, shape;
  int64_t numel = 0;
  bool sender = true;
};

at::Tensor block(const at::Tensor& full, const Piece& p) {
  at::Tensor b = full;
  for (size_t d = 0; d < p.shape.size(); ++d) b = b.narrow(static_cast<int64_t>(d), p.offset[d], p.shape[d]);
  return b;
}

}  // namespace

// The parameters on one mesh, each with its owner and every rank's piece, and the split
// sizes of the two all-to-alls (to the owners, back from them), fixed by the layouts.
struct Muon::Exchange {
  DeviceMesh mesh;
  const comm::Group* group;
  std::vector<size_t> params;
  std::vector<int> owner;
  std::vector<std::vector<Piece>> pieces;  // [entry][group rank]
  std::vector<std::vector<int64_t>> shapes;  // global, per entry
  std::vector<int64_t> to_owner_send, to_owner_recv, back_send, back_recv;

  Exchange(const DeviceMesh& m, const std::vector<DTensor*>& all, std::vector<size_t> idx)
      : mesh(m), group(&m.whole_group()), params(std::move(idx)) {
    const int n = group->size(), me = group->rank();
    // Owners: the costliest matrices first, each to the least loaded rank.
    std::vector<size_t> order(params.size());
    std::iota(order.begin(), order.end(), 0);
    auto cost = [&](size_t e) {
      const auto& s = all[params[e]]->sizes();
      return double(s[0]) * double(s[1]) * double(std::min(s[0], s[1]));
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cost(x) > cost(y); });
    std::vector<double> load(n, 0);
    owner.assign(params.size(), 0);
    for (size_t e : order) {
      owner[e] = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[owner[e]] += cost(e);
    }
    for (size_t e = 0; e < params.size(); ++e) {
      const ShardSpec& spec = all[params[e]]->spec();
      shapes.push_back(spec.shape());
      std::vector<Piece> per_rank(n);
      for (int r = 0; r < n; ++r) {
        std::vector<int64_t> coord = mesh.shape().coord_of(group->global_rank(r));
        Piece& p = per_rank[r];
        p.offset = spec.global_offset(coord);
        p.shape = spec.local_shape(coord);
        p.numel = p.shape[0] * p.shape[1];
        for (int k = 0; k < mesh.ndim(); ++k) p.sender = p.sender && (spec.placement(k).is_shard() || coord[k] == 0);
      }
      pieces.push_back(std::move(per_rank));
    }
    to_owner_send.assign(n, 0), to_owner_recv.assign(n, 0), back_send.assign(n, 0), back_recv.assign(n, 0);
    for (size_t e = 0; e < params.size(); ++e) {
      const int o = owner[e];
      if (pieces[e][me].sender) to_owner_send[o] += pieces[e][me].numel;
      back_recv[o] += pieces[e][me].numel;
      if (o != me) continue;
      for (int r = 0; r < n; ++r) {
        if (pieces[e][r].sender) to_owner_recv[r] += pieces[e][r].numel;
        back_send[r] += pieces[e][r].numel;
      }
    }
  }

  static at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_splits,
                               const std::vector<int64_t>& recv_splits, const comm::Group& g) {
    at::Tensor recv = at::empty({std::accumulate(recv_splits.begin(), recv_splits.end(), int64_t{0})}, send.options());
    if (g.size() == 1) return recv.copy_(send);
    comm::all_to_all_single_async(recv, send, g, recv_splits, send_splits).wait();
    return recv;
  }

  // Local updates in, local orthogonalised updates out.
  std::vector<at::Tensor> orthogonalise(const std::vector<at::Tensor>& local, int ns_steps) {
    const int n = group->size(), me = group->rank();
    // To the owners: destination-major, entries in order.
    std::vector<at::Tensor> out_pieces;
    for (int d = 0; d < n; ++d)
      for (size_t e = 0; e < params.size(); ++e)
        if (owner[e] == d && pieces[e][me].sender) out_pieces.push_back(local[e].reshape({-1}));
    at::Tensor send = out_pieces.empty() ? at::empty({0}, local[0].options()) : at::cat(out_pieces);
    at::Tensor got = all_to_all(send, to_owner_send, to_owner_recv, *group);

    // Each owned matrix assembled from its pieces, orthogonalised once.
    std::vector<at::Tensor> full(params.size());
    for (size_t e = 0; e < params.size(); ++e)
      if (owner[e] == me) full[e] = at::empty(shapes[e], local[e].options());
    int64_t at_ = 0;
    for (int r = 0; r < n; ++r)
      for (size_t e = 0; e < params.size(); ++e) {
        if (owner[e] != me || !pieces[e][r].sender) continue;
        const Piece& p = pieces[e][r];
        block(full[e], p).copy_(got.narrow(0, at_, p.numel).view(p.shape));
        at_ += p.numel;
      }
    std::vector<at::Tensor> back_pieces;
    std::vector<at::Tensor> ortho(params.size());
    for (size_t e = 0; e < params.size(); ++e) {
      if (owner[e] != me) continue;
      const auto& s = shapes[e];
      ortho[e] = newton_schulz(full[e], ns_steps).to(local[e].scalar_type()) *
                 std::sqrt(std::max(1.0, double(s[0]) / double(s[1])));
    }
    for (int d = 0; d < n; ++d)
      for (size_t e = 0; e < params.size(); ++e)
        if (owner[e] == me) back_pieces.push_back(block(ortho[e], pieces[e][d]).reshape({-1}));
    send = back_pieces.empty() ? at::empty({0}, local[0].options()) : at::cat(back_pieces);
    got = all_to_all(send, back_send, back_recv, *group);

    std::vector<at::Tensor> result(params.size());
    at_ = 0;
    for (int o = 0; o < n; ++o)
      for (size_t e = 0; e < params.size(); ++e) {
        if (owner[e] != o) continue;
        const Piece& p = pieces[e][me];
        result[e] = got.narrow(0, at_, p.numel).view(p.shape);
        at_ += p.numel;
      }
    return result;
  }
};

Muon::Muon(std::vector<DTensor*> params, MuonOptions options) : params_(std::move(params)), options_(options) {
  std::map<std::string, std::vector<size_t>> by_mesh;
  std::map<std::string, DeviceMesh> meshes;
  for (size_t i = 0; i < params_.size(); ++i) {
    DTensor* p = params_[i];
    HP_CHECK(p->dim() == 2) << "Muon: parameter " << i << " has shape " << to_string_list(p->sizes())
                            << "; Muon takes 2-D weights (give the others to AdamW)";
    for (const Placement& pl : p->placements())
      HP_CHECK(!pl.is_partial()) << "Muon: parameter " << i << " is Partial: " << p->spec().to_string();
    momentum_.push_back(at::zeros_like(p->to_local()));
    const std::string key = p->device_mesh().to_string();
    by_mesh[key].push_back(i);
    meshes.emplace(key, p->device_mesh());
  }
  for (auto& [key, idx] : by_mesh) exchanges_.push_back(std::make_unique<Exchange>(meshes.at(key), params_, idx));
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
    std::vector<at::Tensor> updates;
    for (size_t i : ex->params) {
      at::Tensor g = params_[i]->to_local().grad();
      if (!g.defined()) g = at::zeros_like(momentum_[i]);  // every rank takes part in the exchange
      momentum_[i].mul_(o.momentum).add_(g);
      updates.push_back(o.nesterov ? g + o.momentum * momentum_[i] : momentum_[i].clone());
    }
    std::vector<at::Tensor> ortho = ex->orthogonalise(updates, o.ns_steps);
    for (size_t e = 0; e < ex->params.size(); ++e) {
      at::Tensor p = params_[ex->params[e]]->to_local();
      if (!p.grad().defined()) continue;
      p.mul_(1 - o.lr * o.weight_decay).add_(ortho[e], -o.lr);
    }
  }
}

std::vector<StateEntry> Muon::state() {
  std::vector<StateEntry> out;
  for (size_t i = 0; i < params_.size(); ++i) out.push_back({params_[i], "momentum", &momentum_[i]});
  return out;
}

}  // namespace hp::optim
