#include "hp/optim/chained.h"

#include <set>

#include "hp/base/error.h"

namespace hp::optim {

ChainedOptimizer::ChainedOptimizer(std::vector<std::unique_ptr<Optimizer>> parts, double reference)
    : parts_(std::move(parts)) {
  for (auto& p : parts_) base_lr_.push_back(p->lr());
  reference_ = reference >= 0 ? reference : base_lr_.empty() ? 0 : base_lr_[0];
}

void ChainedOptimizer::step() {
  for (auto& p : parts_) p->step();
}
void ChainedOptimizer::zero_grad() {
  for (auto& p : parts_) p->zero_grad();
}
double ChainedOptimizer::lr() const { return reference_ * scale_; }
void ChainedOptimizer::set_lr(double lr) {
  scale_ = reference_ == 0 ? 0 : lr / reference_;
  for (size_t i = 0; i < parts_.size(); ++i) parts_[i]->set_lr(base_lr_[i] * scale_);
}
std::vector<DTensor*> ChainedOptimizer::params() const {
  std::vector<DTensor*> out;
  for (auto& p : parts_)
    for (DTensor* t : p->params()) out.push_back(t);
  return out;
}
void ChainedOptimizer::set_steps(int64_t steps) {
  for (auto& p : parts_) p->set_steps(steps);
}
std::vector<StateEntry> ChainedOptimizer::state() {
  std::vector<StateEntry> out;
  for (auto& p : parts_)
    for (auto& s : p->state()) out.push_back(s);
  return out;
}

ChainedOptimizer get_hyper_optimizer(nn::Module& model, std::vector<DTensor*> muon_params,
                                     std::vector<DTensor*> adamw_params, MuonOptions muon, AdamWOptions adamw) {
  std::multiset<const DTensor*> given(muon_params.begin(), muon_params.end());
  given.insert(adamw_params.begin(), adamw_params.end());
  for (auto& [name, p] : model.named_parameters()) {
    if (!p->requires_grad()) continue;
    HP_CHECK(given.count(p) == 1) << "get_hyper_optimizer: parameter '" << name << "' is in "
                                  << (given.count(p) ? "both groups" : "neither group");
  }
  std::vector<std::unique_ptr<Optimizer>> parts;
  if (!muon_params.empty()) parts.push_back(std::make_unique<Muon>(std::move(muon_params), muon));
  if (!adamw_params.empty()) parts.push_back(std::make_unique<AdamW>(std::move(adamw_params), adamw));
  return ChainedOptimizer(std::move(parts));
}

std::vector<DTensor*> default_muon_params(nn::Module& model) {
  std::vector<DTensor*> matrices;
  for (auto& [name, p] : model.named_parameters())
    if (p->requires_grad() && p->dim() == 2 && name.rfind("layers.", 0) == 0) matrices.push_back(p);
  return matrices;
}

ChainedOptimizer get_hyper_optimizer(nn::Module& model, MuonOptions muon, AdamWOptions adamw) {
  std::vector<DTensor*> matrices = default_muon_params(model), rest;
  const std::set<const DTensor*> to_muon(matrices.begin(), matrices.end());
  for (DTensor* p : model.parameters())
    if (p->requires_grad() && !to_muon.count(p)) rest.push_back(p);
  return get_hyper_optimizer(model, std::move(matrices), std::move(rest), muon, adamw);
}

std::function<std::unique_ptr<Optimizer>(std::vector<DTensor*>)> hyper_optimizer_parts(nn::Module& model,
                                                                                      MuonOptions muon,
                                                                                      AdamWOptions adamw) {
  const std::vector<DTensor*> matrices = default_muon_params(model);
  muon.split_params = muon_split_params(matrices, muon);
  muon.split = MuonSplit::Listed;
  return [to_muon = std::set<const DTensor*>(matrices.begin(), matrices.end()), muon,
          adamw](std::vector<DTensor*> ps) -> std::unique_ptr<Optimizer> {
    std::vector<DTensor*> mine, rest;
    for (DTensor* p : ps) (to_muon.count(p) ? mine : rest).push_back(p);
    std::vector<std::unique_ptr<Optimizer>> parts;
    if (!mine.empty()) parts.push_back(std::make_unique<Muon>(std::move(mine), muon));
    if (!rest.empty()) parts.push_back(std::make_unique<AdamW>(std::move(rest), adamw));
    return std::make_unique<ChainedOptimizer>(std::move(parts), muon.lr);
  };
}

double warmup_constant_lr(int64_t step, double base, int64_t warmup) {
  return warmup > 0 && step < warmup ? base * double(step + 1) / double(warmup) : base;
}

}  // namespace hp::optim
