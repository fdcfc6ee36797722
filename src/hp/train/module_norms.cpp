#include "hp/train/module_norms.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"

namespace hp::train {
namespace {

// One hooked module's sums of squares over this rank's piece, this step.
struct Slot {
  std::string name;
  at::Tensor act_sq, grad_sq;     // float64 scalars; undefined until something arrives
  std::optional<DeviceMesh> mesh;  // of its output
  std::vector<int> sharded_dims;   // mesh dims its output is sharded over: the sums add up there
};

bool owns_parameters(nn::Module& m) {
  for (const auto& [name, p] : m.named_parameters())
    if (name.find('.') == std::string::npos) return true;  // not a child's
  return false;
}

void accumulate(at::Tensor& sum, const at::Tensor& piece) {
  at::NoGradGuard no_grad;
  at::Tensor sq = piece.detach().to(at::kDouble).square().sum();
  sum = sum.defined() ? sum + sq : sq;
}

}  // namespace

struct ModuleNormRecorder::State {
  bool armed = false;
  std::vector<Slot> slots;
  std::vector<size_t> forward_order, backward_order;  // slots as their output or gradient first came

  void on_gradient(size_t i, const at::Tensor& grad) {
    Slot& s = slots[i];
    if (!s.grad_sq.defined()) backward_order.push_back(i);
    accumulate(s.grad_sq, grad);  // laid out as the output, Partial read as Replicate
  }

  void on_output(size_t i, const DTensor& out, const std::shared_ptr<State>& self) {
    Slot& s = slots[i];
    if (!s.act_sq.defined()) forward_order.push_back(i);
    s.mesh = out.device_mesh();
    s.sharded_dims.clear();
    std::vector<Placement> whole = out.placements();
    bool partial = false;
    for (int d = 0; d < out.device_mesh().ndim(); ++d) {
      if (whole[d].is_shard()) s.sharded_dims.push_back(d);
      if (whole[d].is_partial()) whole[d] = Replicate(), partial = true;
    }
    // Pending sums have no norm until summed; styles usually reduce them before the hooks end.
    accumulate(s.act_sq, partial ? out.detach().redistribute(whole).to_local() : out.to_local());
    if (out.requires_grad())
      out.to_local().register_hook([self, i](const at::Tensor& grad) { self->on_gradient(i, grad); });
  }
};

ModuleNormRecorder::ModuleNormRecorder(nn::Module& model, DeviceMesh mesh)
    : state_(std::make_shared<State>()), mesh_(std::move(mesh)) {
  for (auto& [name, module] : model.named_modules()) {
    if (!owns_parameters(*module)) continue;
    const size_t i = state_->slots.size();
    state_->slots.push_back(Slot{name, {}, {}, std::nullopt, {}});
    std::weak_ptr<State> weak = state_;  // the model may outlive the recorder
    module->register_forward_hook([weak, i](nn::Module&, const DTensor&, const DTensor& out) {
      auto state = weak.lock();
      if (state && state->armed) state->on_output(i, out, state);
      return out;
    });
  }
}

void ModuleNormRecorder::arm(bool on) {
  State& s = *state_;
  s.armed = on;
  for (Slot& slot : s.slots) slot.act_sq = slot.grad_sq = at::Tensor();
  s.forward_order.clear();
  s.backward_order.clear();
}

std::vector<ModuleNorm> ModuleNormRecorder::collect(int64_t step) {
  State& s = *state_;
  s.armed = false;
  const auto& fwd = s.forward_order;
  const auto& bwd = s.backward_order;
  const int64_t n = static_cast<int64_t>(s.slots.size());

  // This rank's first non-finite sum, as a key that orders (outputs, then gradients; by
  // arrival; by rank) so that a minimum over every rank finds the first one anywhere.
  std::vector<at::Tensor> sums;
  for (size_t i : fwd) sums.push_back(s.slots[i].act_sq);
  for (size_t i : bwd) sums.push_back(s.slots[i].grad_sq);
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  int64_t key = kNone;
  if (!sums.empty()) {
    const at::Tensor finite = at::stack(sums).isfinite().cpu();
    const bool* ok = finite.data_ptr<bool>();
    for (int64_t k = 0; k < finite.numel(); ++k) {
      if (ok[k]) continue;
      const int64_t pass = k < static_cast<int64_t>(fwd.size()) ? 0 : 1;
      const int64_t position = pass == 0 ? k : k - static_cast<int64_t>(fwd.size());
      key = ((pass * n + position) * mesh_.size()) + mesh_.rank();
      break;
    }
  }
  at::Tensor first = at::full({}, key, tensor_options(mesh_, at::kLong));
  for (int d = 0; d < mesh_.ndim(); ++d)  // the minimum over each dim in turn is over the whole mesh
    if (mesh_.size(d) > 1) comm::all_reduce_(first, mesh_.group(d), ReduceOp::Min);
  key = first.item<int64_t>();
  if (key != kNone) {
    const int64_t rank = key % mesh_.size(), position = (key / mesh_.size()) % n, pass = key / mesh_.size() / n;
    const auto& order = pass == 0 ? fwd : bwd;
    const std::string name = position < static_cast<int64_t>(order.size()) ? s.slots[order[position]].name : "?";
    HP_FAIL() << "non-finite " << (pass == 0 ? "activation" : "output gradient") << " in " << name << " at step "
              << step << " on rank " << rank;
  }

  // Sums over the dims each output is sharded on, one collective per layout (as clip_grad_norm_).
  struct Layout {
    DeviceMesh mesh;
    std::vector<int> sharded_dims;
    std::vector<size_t> slots;
  };
  std::vector<Layout> layouts;
  for (size_t i : fwd) {
    const Slot& slot = s.slots[i];
    auto it = std::find_if(layouts.begin(), layouts.end(), [&](const Layout& l) {
      return l.mesh == *slot.mesh && l.sharded_dims == slot.sharded_dims;
    });
    if (it == layouts.end()) it = layouts.insert(layouts.end(), Layout{*slot.mesh, slot.sharded_dims, {}});
    it->slots.push_back(i);
  }
  std::vector<ModuleNorm> norms(fwd.size());
  for (const Layout& l : layouts) {
    std::vector<at::Tensor> parts;
    for (size_t i : l.slots) parts.push_back(s.slots[i].act_sq);
    for (size_t i : l.slots) {
      const Slot& slot = s.slots[i];
      parts.push_back(slot.grad_sq.defined() ? slot.grad_sq : at::zeros_like(slot.act_sq));
    }
    at::Tensor total = at::stack(parts);
    for (int d : l.sharded_dims) comm::all_reduce_(total, l.mesh.group(d));
    total = total.sqrt().cpu();
    const double* v = total.data_ptr<double>();
    const size_t k = l.slots.size();
    for (size_t j = 0; j < k; ++j) {
      const size_t position = std::find(fwd.begin(), fwd.end(), l.slots[j]) - fwd.begin();
      norms[position] = ModuleNorm{s.slots[l.slots[j]].name, v[j], v[k + j]};
    }
  }
  return norms;
}

}  // namespace hp::train
