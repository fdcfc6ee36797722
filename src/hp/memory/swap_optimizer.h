// An optimizer whose state lives in a storage tier (files on this machine) between steps.
//
// The parameters are split into byte-balanced batches (contiguous, in order, each about
// `batch_bytes` of parameters, so of state too; the same batches on every rank of a sharded
// model), and one inner optimizer is made per batch
// by the factory (AdamW, Muon: anything whose update of a parameter reads only that
// parameter's own state, so batching changes no number). A step streams the batches: load
// batch n's state, update, write it back and free it; with prefetch, batch n+1's state is
// read on another thread while n updates, and with write-behind batch n is written on
// another thread while n+1 updates. Resident optimizer state is then at most three
// batches' (two without write-behind) instead of all of it.
//
// A failed write (a full disk) is an error naming the file, thrown once every batch of the
// step is updated; the state it was writing stays in memory: nothing is lost, and the next
// step writes it again. A file that
// disappears is an error naming it at the next read. state() (checkpoints) brings every
// batch back into memory; the next step sends them out again.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "hp/memory/offloaded_parameters.h"
#include "hp/memory/storage_tier.h"
#include "hp/optim/optimizer.h"

namespace hp::memory {

struct SwapOptimizerOptions {
  int64_t batch_bytes = int64_t{64} << 20;  // of parameters per batch
  bool prefetch = true;                     // read batch n+1 while batch n updates
  bool write_behind = true;                 // write batch n while batch n+1 updates
  // Parameters kept off memory too (FSDPModule::offloaded_parameters()): each batch's are
  // brought in with its state and sent out with it, so parameters, gradients and state
  // stream together.
  std::shared_ptr<OffloadedParameters> parameters;
};

using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<DTensor*>)>;

class SwapOptimizer : public optim::Optimizer {
 public:
  SwapOptimizer(std::vector<DTensor*> params, OptimizerFactory make, std::shared_ptr<StorageTier> tier,
                SwapOptimizerOptions options = {});
  void step() override;
  void zero_grad() override { optim::zero_grads(params_); }
  void set_lr(double lr) override;
  double lr() const override { return batches_.front().inner->lr(); }
  std::vector<DTensor*> params() const override { return params_; }
  int64_t steps() const override { return batches_.front().inner->steps(); }
  void set_steps(int64_t steps) override;
  std::vector<optim::StateEntry> state() override;

  int num_batches() const { return static_cast<int>(batches_.size()); }
  // Bytes of optimizer state in memory now.
  int64_t resident_bytes() const;

 private:
  struct Batch {
    std::vector<DTensor*> params;
    std::unique_ptr<optim::Optimizer> inner;
    std::vector<optim::StateEntry> entries;
    std::vector<std::vector<int64_t>> sizes;  // of each entry
    std::vector<at::TensorOptions> options;
    bool resident = true;
  };
  std::string key(size_t batch, size_t entry) const;
  std::vector<at::Tensor> load(size_t b) const;
  void install(size_t b, std::vector<at::Tensor> state);
  void evict(size_t b);
  void write(size_t b) const;
  std::vector<at::Tensor> bring_in(size_t b) const;  // parameters and state
  void send_out(size_t b);
  void release(size_t b);

  std::vector<DTensor*> params_;
  std::shared_ptr<StorageTier> tier_;
  SwapOptimizerOptions options_;
  std::vector<Batch> batches_;
};

}  // namespace hp::memory
