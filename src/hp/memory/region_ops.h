// What a full checkpoint region's recompute may leave out. The recompute runs the region's
// forward again with gradients on, for the graph its backward differentiates; the output's
// value is never read. So a product whose output only flows into the region's output
// through ops whose backward keeps no values (adds, views, collectives) is needed for its
// backward node alone: a block's last projection, whose output meets only the residual
// add, or an MLP region's down projection, its output. The recompute gives such an
// hp::linear op's node without running its product (linear_graph_only): about a third of an
// MLP's recompute.
//
// The forward (without gradients) finds those ops among the ops it observes (ForwardOps);
// the recompute stands in for them (GraphOnlyRecompute), and then checks the graph it built:
// where a node that keeps values reads a stand-in's output, which only code the observer
// does not see can do (LibTorch ops on local tensors), the recompute runs again without
// stand-ins and the wrapper's region stops using them. As for nested regions, code that
// turns such an output into a number outside autograd (item(), a data-dependent branch)
// would not be seen.
//
// Ops are identified across forward and recompute by their weight, a parameter of the
// region (the recompute's leaves share its storage), and how many times the region has used
// it so far; only the region's own ops count, not those of regions nested inside it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <utility>
#include <vector>

#include "hp/memory/storage_map.h"
#include "hp/tensor/op_observer.h"

namespace hp::memory {

class Nest;

// A parameter of the region (its index) and its use (the first is 0).
using WeightUse = std::pair<int, int>;

// What a full region's forward learned of its ops, which a nested region's stand-in
// carries to the backward that recomputes it.
struct RegionOps {
  bool split_sequences = true;      // token chunks may split a sequence's tokens (token_chunk_check.h)
  std::vector<WeightUse> graph_only;  // hp::linear ops whose output value the recompute never reads
};

// at::linear(x, weight) (no bias) for its backward only: the output is zeros, without the
// product; the gradients are bitwise at::linear's. `x` must be contiguous (a column-major
// one takes another path through autograd's mm backward).
at::Tensor linear_graph_only(const at::Tensor& x, const at::Tensor& weight);

// Names the region's hp::linear ops in the order they run: by their weight, a parameter of
// the region, and how many times it was used before.
class WeightUses {
 public:
  explicit WeightUses(const std::vector<at::Tensor>& params);
  // {-1, -1} for any other op, or a weight that is not a parameter.
  WeightUse of(const ObservedOp& op);

 private:
  StorageMap<int> params_;  // its storage -> the parameter's index
  std::vector<int> uses_;   // per parameter
};

// Records the region's own ops while its forward runs (installed as the thread's observer).
class ForwardOps : public OpObserver {
 public:
  explicit ForwardOps(const std::vector<at::Tensor>& params);
  ~ForwardOps() override;
  ForwardOps(const ForwardOps&) = delete;
  ForwardOps& operator=(const ForwardOps&) = delete;

  at::Tensor run(const ObservedOp& op, const std::function<at::Tensor()>& compute) override;
  // After the forward: the hp::linear ops whose output only reaches `output` through ops
  // that keep no values, and that nothing else observed reads.
  std::vector<WeightUse> graph_only(const at::Tensor& output) const;

 private:
  struct Seen {
    WeightUse weight{-1, -1};       // an hp::linear op's; -1: another op
    bool keeps_no_values = false;   // its backward reads no values: an add, a view, a redistribution
    std::vector<int> readers;       // ops that read its output
    const void* output = nullptr;   // its output's storage
  };
  WeightUses weights_;
  std::vector<Seen> ops_;
  StorageMap<int> by_storage_;  // an op's output storage -> the op
  const Nest* nest_;
  OpObserver* outer_;
  std::unique_ptr<ScopedOpObserver> scope_;
};

// Stands in for the `graph_only` ops while the recompute runs (installed as the observer).
class GraphOnlyRecompute : public OpObserver {
 public:
  GraphOnlyRecompute(const std::vector<WeightUse>& graph_only, const std::vector<at::Tensor>& params);
  ~GraphOnlyRecompute() override;
  GraphOnlyRecompute(const GraphOnlyRecompute&) = delete;
  GraphOnlyRecompute& operator=(const GraphOnlyRecompute&) = delete;

  at::Tensor run(const ObservedOp& op, const std::function<at::Tensor()>& compute) override;
  // After the recompute: whether a node that keeps values reads a stand-in's output in the
  // graph under `out` (nodes made before `first_seq` are outside the region).
  bool read(const at::Tensor& out, uint64_t first_seq) const;
  int stood_in() const { return static_cast<int>(nodes_.size()); }

 private:
  std::vector<WeightUse> graph_only_;
  WeightUses weights_;
  std::vector<const torch::autograd::Node*> nodes_;  // the stand-ins' backward nodes
  const Nest* nest_;
  OpObserver* outer_;
  std::unique_ptr<ScopedOpObserver> scope_;
};

}  // namespace hp::memory
