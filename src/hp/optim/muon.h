// Muon: momentum, then the update of each 2-D weight orthogonalised by a Newton-Schulz
// iteration (the nearest semi-orthogonal matrix), scaled by sqrt(max(1, rows / cols)).
//
// On sharded weights each matrix's orthogonalisation runs once, on an owner rank: owners
// are assigned greedily by cost (rows * cols * min(rows, cols)) so that the work is
// balanced, and two all-to-alls per step move the data: every piece of each momentum
// update to its owner, every piece of each result back to the ranks that hold it. A
// replicated piece is sent by one rank only. Everything else (momentum, weight decay, the
// step) is elementwise on the local shards.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "hp/optim/newton_schulz.h"
#include "hp/optim/optimizer.h"

namespace hp::optim {

struct MuonOptions {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  double weight_decay = 0;
};

class Muon : public Optimizer {
 public:
  // Every parameter must be 2-D.
  Muon(std::vector<DTensor*> params, MuonOptions options = {});
  ~Muon() override;
  void step() override;
  void zero_grad() override { zero_grads(params_); }
  void set_lr(double lr) override { options_.lr = lr; }
  double lr() const override { return options_.lr; }
  std::vector<DTensor*> params() const override { return params_; }
  int64_t steps() const override { return step_; }
  void set_steps(int64_t steps) override { step_ = steps; }
  std::vector<StateEntry> state() override;  // "momentum" per parameter
  // The rank of the parameter's mesh (group rank) that orthogonalises it.
  int owner(size_t param_index) const;

 private:
  struct Exchange;  // the all-to-all plan of the parameters on one mesh
  std::vector<DTensor*> params_;
  std::vector<at::Tensor> momentum_;
  MuonOptions options_;
  int64_t step_ = 0;
  std::vector<std::unique_ptr<Exchange>> exchanges_;
};

}  // namespace hp::optim
