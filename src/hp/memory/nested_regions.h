// Full checkpoint regions inside full regions (a block checkpointed, and its MLP inside it,
// split into token chunks): the inner region keeps only its input, and its backward
// recomputes it. Run naively, the enclosing region's recompute would run the inner forward
// once more, only to produce an output nobody reads: a block's output is the residual
// stream plus the MLP's output, and the add keeps no values for its backward.
//
// So the enclosing region's forward records each inner region's output layout, and its
// recompute stands in for an inner region with an uninitialised tensor of that layout and
// the inner region's backward node, deferring the inner forward to that node. Then it
// checks the recomputed graph: if a node that keeps values (anything but adds, views and
// the like) reads a stand-in, directly or through other ops, the recompute runs again with
// that inner region computed, and the region is remembered as one whose output is read
// (e.g. attention, whose output feeds the next norm). Every rank builds the same graph, so
// every rank defers the same regions and their collectives still pair up. Only reads
// through the graph are seen: code that turns an inner output into a number or a branch
// outside autograd (item(), a data-dependent shape) must not run after a nested region.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "hp/memory/region_ops.h"
#include "hp/tensor/dtensor.h"
#include "hp/tensor/random.h"

namespace hp::memory {

// A checkpoint_wrapper'd module, as a region that may be nested in another.
struct NestedRegion {
  std::atomic<bool> output_read{false};  // a recompute was seen to read its output
  std::atomic<bool> graph_only_read{false};  // a recompute read an output it left out (region_ops.h)
};

// An inner region's output as the enclosing region's forward saw it.
struct InnerOutput {
  std::shared_ptr<NestedRegion> region;
  std::vector<int64_t> input_sizes;  // of the input's local tensor: a stand-in needs the same
  std::vector<int64_t> sizes, strides;
  at::TensorOptions options;
  DTensor like;                      // mesh and layout (its local is a meta tensor)
  RngState rng_after;                // a stand-in leaves the RNG where the forward did
  RegionOps ops;                     // what its forward learned of its ops
};

// What the running enclosing region tells the regions called inside it; the thread's
// innermost one while it lives.
class Nest {
 public:
  enum class Phase { Forward, Recompute };
  Nest(Phase phase, std::vector<InnerOutput>* outputs);
  ~Nest();
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;

  static Nest* current();
  Phase phase() const { return phase_; }

  // Forward: an inner region returned `out` for `input`.
  void record(std::shared_ptr<NestedRegion> region, const DTensor& input, const DTensor& out, RegionOps ops);
  // Recompute: the layout to stand in for the next inner region with, or none (run it).
  std::optional<InnerOutput> stand_in(const NestedRegion* region, const DTensor& input);
  // Recompute: `node` is the backward node of a stand-in for `region`.
  void stood_in(NestedRegion* region, const torch::autograd::Node* node);
  // Recompute, done: whether a value-keeping node of the graph under `out` reads a
  // stand-in (nodes made before `first_seq` are outside the region). Each region read is
  // marked output_read, so the next recompute runs it.
  bool read_stand_ins(const at::Tensor& out, uint64_t first_seq);

 private:
  Phase phase_;
  std::vector<InnerOutput>* outputs_;
  size_t next_ = 0;
  std::vector<std::pair<NestedRegion*, const torch::autograd::Node*>> stand_ins_;
  Nest* outer_;
};

// Per stand-in (the backward node of an output whose values were not computed): whether a
// node that keeps values (anything but adds, views and the like) of the graph under `out`
// reads it, directly or through nodes that keep none; nodes made before `first_seq` are
// outside the region.
std::vector<bool> values_read(const at::Tensor& out, uint64_t first_seq,
                              const std::vector<const torch::autograd::Node*>& stand_ins);

}  // namespace hp::memory
