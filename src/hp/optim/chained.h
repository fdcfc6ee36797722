// Several optimizers stepping as one, each over its own parameters (Muon for the hidden
// matrices, AdamW for the rest), and HyperParallel's get_hyper_optimizer that builds one.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "hp/nn/module.h"
#include "hp/optim/adamw.h"
#include "hp/optim/muon.h"

namespace hp::optim {

class ChainedOptimizer : public Optimizer {
 public:
  // `reference`: the rate lr() and set_lr() speak of (< 0: the first part's base rate), so
  // that chains over parts of one model's parameters follow one schedule alike.
  explicit ChainedOptimizer(std::vector<std::unique_ptr<Optimizer>> parts, double reference = -1);
  void step() override;
  void zero_grad() override;
  // A schedule drives every part along one curve: set_lr(x) scales every part's base rate
  // by x / reference, and lr() is the reference so scaled.
  void set_lr(double lr) override;
  double lr() const override;
  std::vector<DTensor*> params() const override;
  int64_t steps() const override { return parts_.empty() ? 0 : parts_[0]->steps(); }
  void set_steps(int64_t steps) override;
  std::vector<StateEntry> state() override;
  Optimizer& part(size_t i) { return *parts_.at(i); }

 private:
  std::vector<std::unique_ptr<Optimizer>> parts_;
  std::vector<double> base_lr_;
  double reference_ = 0, scale_ = 1;
};

// Muon over `muon_params`, AdamW over `adamw_params`; every trainable parameter of
// `model` must be in exactly one of the two.
ChainedOptimizer get_hyper_optimizer(nn::Module& model, std::vector<DTensor*> muon_params,
                                     std::vector<DTensor*> adamw_params, MuonOptions muon = {},
                                     AdamWOptions adamw = {});
// The usual split: 2-D weights inside the blocks to Muon; embeddings, the output
// projection and every 1-D parameter (norms, biases) to AdamW.
ChainedOptimizer get_hyper_optimizer(nn::Module& model, MuonOptions muon = {}, AdamWOptions adamw = {});
// The parameters of `model` that the usual split gives Muon.
std::vector<DTensor*> default_muon_params(nn::Module& model);
// Makes the usual split's chain over any part of `model`'s parameters (a SwapOptimizer's
// batch): Muon over the part's block matrices, splitting those that one Muon over all of
// them would split, AdamW over the rest, the rate relative to Muon's as the whole chain's
// is. Batches so made compute the numbers of get_hyper_optimizer(model, muon, adamw).
std::function<std::unique_ptr<Optimizer>(std::vector<DTensor*>)> hyper_optimizer_parts(nn::Module& model,
                                                                                      MuonOptions muon = {},
                                                                                      AdamWOptions adamw = {});

// Learning-rate schedules. Linear warm-up to `base` over `warmup` steps, then:
double warmup_constant_lr(int64_t step, double base, int64_t warmup);

}  // namespace hp::optim
