#include "hp/parallel/low_precision.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/nn/layers.h"
#include "hp/parallel/tensor_parallel.h"
#include "hp/tensor/fp8_linear.h"

namespace hp {
namespace {

bool any_matches(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return name_matches(p, name); });
}

}  // namespace

std::vector<std::string> apply_low_precision(nn::Module& model, const LowPrecisionConfig& config) {
  HP_CHECK(config.format == "e4m3") << "low precision format '" << config.format
                                    << "': only e4m3 (weights and activations; gradients e5m2)";
  Fp8LinearOptions options;
  options.scaling = parse_fp8_scaling(config.scaling);
  options.delayed = config.delayed;
  options.history_len = config.history_len;
  options.enable_fsdp_float8_all_gather = config.enable_fsdp_float8_all_gather;

  std::vector<nn::Linear*> linears;
  std::vector<std::string> names;
  for (auto& [name, m] : model.named_modules())
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      linears.push_back(lin);
      names.push_back(name);
    }
  for (const auto& pattern : config.include_fqns)
    HP_CHECK(std::any_of(names.begin(), names.end(), [&](const std::string& n) { return name_matches(pattern, n); }))
        << "apply_low_precision: pattern '" << pattern << "' matches no Linear";

  std::vector<std::string> swapped;
  for (size_t i = 0; i < linears.size(); ++i) {
    const bool included = config.include_fqns.empty() || any_matches(config.include_fqns, names[i]);
    if (!included || any_matches(config.exclude_fqns, names[i])) continue;
    linears[i]->set_product(Fp8Linear(options));  // each layer its own amax histories
    swapped.push_back(names[i]);
  }
  return swapped;
}

}  // namespace hp
