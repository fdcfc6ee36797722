// Muon: momentum, then the update of each 2-D weight orthogonalised by a Newton-Schulz
// iteration (the nearest semi-orthogonal matrix), scaled by sqrt(max(1, rows / cols)).
//
// On sharded weights each matrix's orthogonalisation runs once in the job. Most go whole to
// an owner rank, assigned greedily by cost (the iteration's flops) so that the work is
// balanced. When whole matrices cannot balance it (fewer large matrices than ranks, or
// one that outweighs the rest), the largest are orthogonalised by all ranks together, each
// on a block of its long side (the short side's Gram matrices summed by one all-reduce per
// iteration): MuonOptions::split says which. All-to-alls move the data: every piece of
// each momentum update to the ranks that work on it, every piece of each result back to
// the ranks that hold it. A replicated piece is sent by one rank only. With `overlap` the
// matrices go in rounds (each owner's first, then its second, ...): every round's pieces
// are sent at once, and a round's results travel back while the next round is computed,
// on the asynchronous collectives; the arithmetic, and so the result, is the same.
// Everything else (momentum, weight decay, the step) is elementwise on local shards.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "hp/optim/newton_schulz.h"
#include "hp/optim/optimizer.h"

namespace hp::optim {

// Which matrices all ranks of a mesh orthogonalise together, each on a block.
enum class MuonSplit {
  Balanced,  // the largest, as many as shorten the busiest rank's work (ties: fewer)
  None,      // every matrix whole on one owner
  All,       // every matrix in blocks
  Listed,    // those in MuonOptions::split_params: as another Muon chose (muon_split_params)
};

struct MuonOptions {
  double lr = 0.02;
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  // The Newton-Schulz iteration's precision: bfloat16, as the reference Muon, pays where
  // the hardware multiplies it fast (AMX, tensor cores); the update is float32 either way.
  at::ScalarType ns_dtype = at::kFloat;
  double weight_decay = 0;
  MuonSplit split = MuonSplit::Balanced;
  bool overlap = true;  // false: one exchange each way, around all the work
  std::vector<const DTensor*> split_params;  // MuonSplit::Listed
};

// The parameters that Muon(params, options) orthogonalises in blocks on every rank of their
// mesh. Muons over parts of `params` (a SwapOptimizer's batches) given them as
// MuonSplit::Listed split the same matrices, and so compute the same numbers, as one Muon
// over all of them.
std::vector<const DTensor*> muon_split_params(const std::vector<DTensor*>& params, const MuonOptions& options);

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
  // The rank of the parameter's mesh (group rank) that orthogonalises it; -1 when every
  // rank of the mesh works on a block of it.
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
