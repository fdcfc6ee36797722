#include "hp/train/module_norms.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"

namespace hp::train {
namespace {

// One hooked module's sums of squares over this rank's piece, this step.
struct Slot {
  std::string name;
  at::Tensor act_sq, grad_sq;  // float64 scalars; undefined until something arrives
  double replicas = 1;         // ranks holding each element of the output: the mesh over its sharded dims
};

bool owns_parameters(nn::Module& m) {
  for (const auto& [name, p] : m.named_parameters())
    if (name.find('.') == std::string::npos) return true;  // not a child's
  return false;
}

// Adds the squares of `piece` to `sum`, in float64: a float32 square can overflow where the
// value itself is finite.
void accumulate(at::Tensor& sum, const at::Tensor& piece) {
  at::NoGradGuard no_grad;
  at::Tensor sq = at::linalg_vector_norm(piece.detach(), 2, c10::nullopt, false, at::kDouble).square();
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

  void on_output(size_t i, const DTensor& out, const DeviceMesh& mesh, const std::shared_ptr<State>& self) {
    Slot& s = slots[i];
    if (!s.act_sq.defined()) forward_order.push_back(i);
    HP_CHECK(out.device_mesh() == mesh) << "the monitor expects the output of " << s.name << " on "
                                        << mesh.to_string() << ", not " << out.device_mesh().to_string();
    std::vector<Placement> whole = out.placements();
    bool partial = false;
    s.replicas = static_cast<double>(mesh.size());
    for (int d = 0; d < mesh.ndim(); ++d) {
      if (whole[d].is_shard()) s.replicas /= static_cast<double>(mesh.size(d));
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
    state_->slots.push_back(Slot{name, {}, {}, 1});
    std::weak_ptr<State> weak = state_;  // the model may outlive the recorder
    module->register_forward_hook([weak, i, mesh = mesh_](nn::Module&, const DTensor&, const DTensor& out) {
      auto state = weak.lock();
      if (state && state->armed) state->on_output(i, out, mesh, state);
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

  // Every rank's sums, in slot order: [act_sq of each slot, grad_sq of each slot], one
  // all-gather over the mesh for the non-finite check and the norms together.
  std::vector<at::Tensor> mine;
  const at::Tensor zero = at::zeros({}, tensor_options(mesh_, at::kDouble));
  for (const Slot& slot : s.slots) mine.push_back(slot.act_sq.defined() ? slot.act_sq : zero);
  for (const Slot& slot : s.slots) mine.push_back(slot.grad_sq.defined() ? slot.grad_sq : zero);
  const comm::Group& everyone = mesh_.whole_group();
  at::Tensor all = at::stack(mine);
  if (everyone.size() > 1) all = comm::all_gather(all, everyone);
  all = all.cpu();
  const double* v = all.data_ptr<double>();  // v[r * 2n + pass * n + slot]
  auto sum_of = [&](int r, int pass, size_t slot) { return v[r * 2 * n + pass * n + static_cast<int64_t>(slot)]; };

  // The first non-finite sum: outputs in forward order, then gradients in the order they
  // arrived, the lowest rank first at each.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t slot : pass == 0 ? fwd : bwd) {
      for (int r = 0; r < everyone.size(); ++r) {
        if (std::isfinite(sum_of(r, pass, slot))) continue;
        HP_FAIL() << "non-finite " << (pass == 0 ? "activation" : "output gradient") << " in " << s.slots[slot].name
                  << " at step " << step << " on rank " << everyone.global_rank(r);
      }
    }
  }

  // Each element lies on `replicas` ranks: summing every rank's share of it counts it once.
  std::vector<ModuleNorm> norms;
  for (size_t slot : fwd) {
    double act = 0, grad = 0;
    for (int r = 0; r < everyone.size(); ++r) act += sum_of(r, 0, slot), grad += sum_of(r, 1, slot);
    const double replicas = s.slots[slot].replicas;
    norms.push_back(ModuleNorm{s.slots[slot].name, std::sqrt(act / replicas), std::sqrt(grad / replicas)});
  }
  return norms;
}

}  // namespace hp::train
