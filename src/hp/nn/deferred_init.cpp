#include "hp/nn/deferred_init.h"

#include <ATen/ATen.h>

#include <unordered_map>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/nn/module.h"

namespace hp::nn {
namespace {

thread_local int t_scopes = 0;
// Records of deferred parameters made but not registered yet, by their meta storage.
thread_local std::unordered_map<const c10::TensorImpl*, ParameterInit> t_pending;

// This rank's piece of `p` as drawn whole at the record's state and then sliced.
at::Tensor draw_piece(const DTensor& p, const ParameterInit& init) {
  const std::vector<int64_t> local_shape = p.to_local().sizes().vec();
  if (init.std == 0) return at::full(local_shape, init.value, tensor_options(p.device_mesh()));
  const RngState resume = get_rng_state();
  set_rng_state(init.state);
  at::Tensor piece = randn(init.shape, p.device_mesh(), p.placements()).to_local() * init.std;
  set_rng_state(resume);
  HP_CHECK(piece.sizes().vec() == local_shape)
      << "init_parameters: the piece drawn for " << p.spec().to_string() << " has shape "
      << to_string_list(piece.sizes().vec()) << ", the parameter's local tensor " << to_string_list(local_shape);
  return piece;
}

}  // namespace

NoInitParameters::NoInitParameters() { ++t_scopes; }
NoInitParameters::~NoInitParameters() {
  if (--t_scopes == 0) t_pending.clear();  // made, never registered: nothing will draw them
}

bool initialization_deferred() { return t_scopes > 0; }

DTensor deferred_parameter(const std::vector<int64_t>& shape, const DeviceMesh& mesh, ParameterInit init) {
  init.shape = shape;
  at::Tensor local = at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  t_pending[local.unsafeGetTensorImpl()] = std::move(init);
  return DTensor(local, mesh, make_spec(shape, at::kFloat, mesh, std::vector<Placement>(mesh.ndim(), Replicate())));
}

std::optional<ParameterInit> take_pending_init(const at::Tensor& local) {
  auto it = t_pending.find(local.unsafeGetTensorImpl());
  if (it == t_pending.end()) return std::nullopt;
  ParameterInit init = std::move(it->second);
  t_pending.erase(it);
  return init;
}

void init_parameters(Module& module) {
  at::NoGradGuard no_grad;
  for (auto& [prefix, m] : module.named_modules()) {
    for (auto& [name, init] : m->deferred_inits()) {
      DTensor& p = m->param(name);
      const at::Tensor local = p.to_local();
      if (local.is_meta() && !awaits_init(p)) continue;  // a meta mesh's dry-run keeps its meta tensors
      const at::Tensor piece = draw_piece(p, init);
      if (awaits_init(p)) {
        p = make_parameter(DTensor(piece.to(local.scalar_type()), p.device_mesh(), p.spec()));
        continue;
      }
      HP_CHECK(local.numel() == 0 || local.storage().nbytes() > 0)
          << "init_parameters: parameter '" << (prefix.empty() ? name : prefix + "." + name)
          << "' has given its storage away (offloaded); initialise before offloading";
      local.copy_(piece);
    }
    m->deferred_inits().clear();
  }
}

}  // namespace hp::nn
