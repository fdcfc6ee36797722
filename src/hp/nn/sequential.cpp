#include "hp/nn/sequential.h"

#include "hp/base/error.h"

namespace hp::nn {

void Sequential::append(std::string name, std::shared_ptr<Module> module) {
  HP_CHECK(module) << "Sequential: no module given for '" << name << "'";
  for (const auto& [n, m] : named_children()) HP_CHECK(n != name) << "Sequential: '" << name << "' appended twice";
  register_module(std::move(name), std::move(module));
}

DTensor Sequential::forward(const DTensor& x) {
  DTensor h = x;
  for (const auto& [name, m] : named_children()) h = (*m)(h);
  return h;
}

}  // namespace hp::nn
