#include "hp/nn/module.h"

#include "hp/base/error.h"
#include "hp/tensor/weight_outputs.h"

namespace hp::nn {

DTensor Module::operator()(const DTensor& x) {
  HP_CHECK(deferred_.empty()) << not_drawn_yet("parameter '" + deferred_.begin()->first + "'",
                                               "after sharding the model, before running it");
  DTensor in = x;
  for (auto& h : pre_hooks_) in = h(*this, in);
  DTensor out = forward_wrapper_ ? forward_wrapper_(*this, in) : forward(in);
  if (!params_.empty() && WeightOutputRecorder::recording()) {  // before the hooks: W must not repeat theirs
    std::vector<at::Tensor> own;
    for (auto& [name, p] : params_)
      if (p->requires_grad()) own.push_back(p->to_local());
    WeightOutputRecorder::record(out.to_local(), std::move(own));
  }
  for (auto& h : post_hooks_) out = h(*this, in, out);
  return out;
}

std::vector<std::pair<std::string, DTensor*>> Module::named_parameters() {
  std::vector<std::pair<std::string, DTensor*>> out;
  for (auto& [name, mod] : named_modules())
    for (auto& [pname, p] : mod->params_) out.emplace_back(name.empty() ? pname : name + "." + pname, p.get());
  return out;
}

std::vector<std::pair<std::string, DTensor*>> Module::named_buffers() {
  std::vector<std::pair<std::string, DTensor*>> out;
  for (auto& [name, mod] : named_modules())
    for (auto& [bname, b] : mod->buffers_) out.emplace_back(name.empty() ? bname : name + "." + bname, b.get());
  return out;
}

std::vector<DTensor*> Module::parameters() {
  std::vector<DTensor*> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [name, child] : children_)
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

DTensor& Module::param(const std::string& name) {
  for (auto& [n, p] : params_)
    if (n == name) return *p;
  HP_FAIL() << "module has no parameter '" << name << "'";
  return *params_.front().second;
}

void Module::zero_grad() {
  for (DTensor* p : parameters()) {
    at::Tensor local = p->to_local();
    if (local.grad().defined()) local.mutable_grad().reset();
  }
}

DTensor& Module::register_parameter(std::string name, DTensor value) {
  if (std::optional<ParameterInit> init = take_pending_init(value.to_local())) deferred_[name] = std::move(*init);
  params_.emplace_back(std::move(name), std::make_unique<DTensor>(make_parameter(value)));
  return *params_.back().second;
}

DTensor& Module::register_buffer(std::string name, DTensor value) {
  buffers_.emplace_back(std::move(name), std::make_unique<DTensor>(value.detach()));
  return *buffers_.back().second;
}

DTensor make_parameter(const DTensor& value) {
  DTensor p = value.detach();
  p.requires_grad_(true);
  return p;
}

}  // namespace hp::nn
