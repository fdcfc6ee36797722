#include "hp/checkpoint/state.h"

#include <ATen/ATen.h>

#include <set>
#include <unordered_map>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/nn/module.h"
#include "hp/optim/optimizer.h"

namespace hp::checkpoint {

void State::add(const std::string& name, const DTensor& t) {
  HP_CHECK(!awaits_init(t)) << not_drawn_yet("checkpoint state: tensor " + name, "before saving or loading it");
  add(name, t.to_local(), t);
}

void State::add(const std::string& name, const at::Tensor& local, const DTensor& like) {
  if (!like.device_mesh().contains_me()) return;
  for (const auto& e : tensors) HP_CHECK(e.name != name) << "checkpoint state: tensor " << name << " added twice";
  auto coord = like.device_mesh().coordinate();
  const auto expected = like.spec().local_shape(coord);
  HP_CHECK(local.defined() && local.sizes().vec() == expected && local.scalar_type() == like.scalar_type())
      << "checkpoint state: tensor " << name << " must have the local shape " << to_string_list(expected)
      << " and dtype " << like.scalar_type() << " of " << like.spec().to_string() << ", found "
      << (local.defined() ? to_string_list(local.sizes().vec()) : std::string("an undefined tensor"));
  tensors.push_back({name, local, like.spec(), std::move(coord)});
}

void State::add_module(nn::Module& model, const std::string& prefix) {
  for (auto& [name, p] : model.named_parameters()) add(prefix + name, *p);
  for (auto& [name, b] : model.named_buffers()) add(prefix + name, *b);
}

void State::add_optimizer(optim::Optimizer& opt, const std::vector<std::pair<std::string, DTensor*>>& named_params,
                          const std::string& prefix) {
  std::unordered_map<const DTensor*, std::string> names;
  for (const auto& [name, p] : named_params) names.emplace(p, name);
  for (const auto& s : opt.state()) {
    auto it = names.find(s.param);
    HP_CHECK(it != names.end()) << "checkpoint state: optimizer state " << s.name
                                << " belongs to a parameter missing from the named parameters given";
    add(prefix + it->second + "." + s.name, *s.local, *s.param);
  }
}

}  // namespace hp::checkpoint
