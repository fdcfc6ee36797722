#include "hp/train/module_norms.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/tensor/recompute_scope.h"

namespace hp::train {
namespace {

// One hooked module's sums of squares over this rank's piece, this step.
struct Slot {
  std::string name;
  at::Tensor act_sq, grad_sq;  // float64 scalars; undefined until something arrives
  double replicas = 1;         // ranks holding each element of the output: the mesh over its sharded dims
  int chunk = 0;               // its pipeline chunk (0 without stages)
};

// The chunk of the top-level module `name` is in or under.
int chunk_of(const std::string& name, const std::map<std::string, int>& chunks) {
  for (const auto& [top, chunk] : chunks)
    if (name == top || name.rfind(top + ".", 0) == 0) return chunk;
  return 0;
}

// A module's norms with where it comes in the whole model's forward: chunk, then the
// order of first outputs inside the chunk.
struct Placed {
  int chunk = 0;
  int64_t position = 0;
  ModuleNorm norm;
};

// The first non-finite value, with a key that orders failures across stages (smaller
// first): activations before gradients, activations by chunk, gradients from the last
// chunk (where backward starts); then order of arrival. "" when none.
struct Failure {
  int64_t key = 0;
  std::string message;
};

// Every rank's `mine`, in group order: one all-gather of the lengths, one of the bytes.
std::vector<std::string> all_gather_text(const std::string& mine, const comm::Group& g, const DeviceMesh& mesh) {
  const at::TensorOptions on = tensor_options(mesh, at::kLong);
  const at::Tensor lengths = comm::all_gather(at::full({1}, static_cast<int64_t>(mine.size()), on), g).cpu();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor bytes = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<uint8_t>());
  const at::Tensor all = comm::all_gather(bytes.to(on.device()), g).cpu();
  std::vector<std::string> out;
  for (int r = 0; r < g.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * bytes.numel();
    out.emplace_back(p, p + lengths[r].item<int64_t>());
  }
  return out;
}

// Each stage's norms and first failure, as every stage sees them: one line a norm
// ("N chunk position act grad module"), and "F key message" for a failure.
std::string to_text(const std::vector<Placed>& norms, const Failure& f) {
  std::ostringstream os;
  os.precision(17);
  if (!f.message.empty()) os << "F " << f.key << " " << f.message << "\n";
  for (const Placed& p : norms)
    os << "N " << p.chunk << " " << p.position << " " << p.norm.act_norm << " " << p.norm.grad_norm << " "
       << p.norm.module << "\n";
  return os.str();
}

void from_text(const std::string& text, std::vector<Placed>& norms, Failure& first) {
  std::istringstream is(text);
  std::string kind;
  while (is >> kind) {
    if (kind == "F") {
      Failure f;
      is >> f.key;
      std::getline(is >> std::ws, f.message);
      if (first.message.empty() || f.key < first.key) first = f;
    } else {
      Placed p;
      is >> p.chunk >> p.position >> p.norm.act_norm >> p.norm.grad_norm >> p.norm.module;
      norms.push_back(p);
    }
  }
}

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

  // `recomputed`: a checkpointed region's recompute, whose outputs the forward recorded
  // already (or that stands in for them, nested_regions.h); only their gradients count.
  void on_output(size_t i, const DTensor& out, const DeviceMesh& mesh, const std::shared_ptr<State>& self,
                 bool recomputed) {
    if (!recomputed) on_activation(i, out, mesh);
    if (out.requires_grad())
      out.to_local().register_hook([self, i](const at::Tensor& grad) { self->on_gradient(i, grad); });
  }

  void on_activation(size_t i, const DTensor& out, const DeviceMesh& mesh) {
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
  }
};

ModuleNormRecorder::ModuleNormRecorder(nn::Module& model, DeviceMesh mesh, StageNorms stages)
    : state_(std::make_shared<State>()), mesh_(std::move(mesh)), stages_(std::move(stages)) {
  for (auto& [name, module] : model.named_modules()) {
    if (!owns_parameters(*module)) continue;
    const size_t i = state_->slots.size();
    state_->slots.push_back(Slot{name, {}, {}, 1, chunk_of(name, stages_.chunk_of)});
    std::weak_ptr<State> weak = state_;  // the model may outlive the recorder
    module->register_forward_hook([weak, i, mesh = mesh_](nn::Module&, const DTensor&, const DTensor& out) {
      auto state = weak.lock();
      if (state && state->armed) state->on_output(i, out, mesh, state, recomputing());
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
  Failure failure;
  constexpr int64_t kPass = int64_t{1} << 40, kChunk = int64_t{1} << 20;
  for (int pass = 0; pass < 2 && failure.message.empty(); ++pass) {
    const auto& order = pass == 0 ? fwd : bwd;
    for (size_t k = 0; k < order.size() && failure.message.empty(); ++k) {
      const size_t slot = order[k];
      for (int r = 0; r < everyone.size(); ++r) {
        if (std::isfinite(sum_of(r, pass, slot))) continue;
        const int chunk = s.slots[slot].chunk;
        failure.key = pass * kPass + (pass == 0 ? chunk : kChunk - 1 - chunk) * kChunk + static_cast<int64_t>(k);
        std::ostringstream os;
        os << "non-finite " << (pass == 0 ? "activation" : "output gradient") << " in " << s.slots[slot].name
           << " at step " << step << " on rank " << everyone.global_rank(r);
        failure.message = os.str();
        break;
      }
    }
  }

  // Each element lies on `replicas` ranks: summing every rank's share of it counts it once.
  std::vector<Placed> placed;
  for (size_t k = 0; k < fwd.size(); ++k) {
    const size_t slot = fwd[k];
    double act = 0, grad = 0;
    for (int r = 0; r < everyone.size(); ++r) act += sum_of(r, 0, slot), grad += sum_of(r, 1, slot);
    const double replicas = s.slots[slot].replicas;
    placed.push_back({s.slots[slot].chunk, static_cast<int64_t>(k),
                      ModuleNorm{s.slots[slot].name, std::sqrt(act / replicas), std::sqrt(grad / replicas)}});
  }
  // Stages: every stage's norms and failures on every rank, so that all stop together.
  const comm::Group* stages = stages_.other_stages;
  if (stages && stages->size() > 1) {
    std::vector<Placed> all;
    Failure first;
    for (const std::string& text : all_gather_text(to_text(placed, failure), *stages, mesh_))
      from_text(text, all, first);
    placed = std::move(all), failure = first;
  }
  HP_CHECK(failure.message.empty()) << failure.message;
  std::stable_sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return std::tie(a.chunk, a.position) < std::tie(b.chunk, b.position);
  });
  std::vector<ModuleNorm> norms;
  for (Placed& p : placed) norms.push_back(std::move(p.norm));
  return norms;
}

}  // namespace hp::train
