#include "hp/memory/nested_regions.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace hp::memory {
namespace {

thread_local Nest* t_nest = nullptr;

// Backward nodes that keep no tensor values, only sizes, scalars or groups: a stand-in may
// flow through them (ATen's adds and views, hp's collectives).
bool keeps_no_values(const torch::autograd::Node& n) {
  static const std::set<std::string> names{
      "AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "NegBackward0", "ViewBackward0",
      "UnsafeViewBackward0", "ReshapeAliasBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0",
      "ExpandBackward0", "CloneBackward0", "CatBackward0", "SliceBackward0", "SelectBackward0", "SplitBackward0",
      "SplitWithSizesBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "SumBackward0",
      "SumBackward1", "AllGatherBackward", "ReduceScatterBackward", "AllReduceSumBackward", "AllToAllBackward",
      "IdentityAllReduceBackward", "RedistributeBackward", "ScaleBackward"};
  return names.count(n.name()) > 0;
}

}  // namespace

Nest::Nest(Phase phase, std::vector<InnerOutput>* outputs) : phase_(phase), outputs_(outputs), outer_(t_nest) {
  t_nest = this;
}

Nest::~Nest() { t_nest = outer_; }

Nest* Nest::current() { return t_nest; }

void Nest::record(std::shared_ptr<NestedRegion> region, const DTensor& input, const DTensor& out,
                  RegionOps ops) {
  const at::Tensor& local = out.to_local();
  at::Tensor meta = at::empty_strided(local.sizes(), local.strides(), local.options().device(at::kMeta));
  outputs_->push_back(InnerOutput{std::move(region), input.to_local().sizes().vec(), local.sizes().vec(),
                                  local.strides().vec(), local.options(), DTensor(meta, out.device_mesh(), out.spec()),
                                  get_rng_state(), std::move(ops)});
}

std::optional<InnerOutput> Nest::stand_in(const NestedRegion* region, const DTensor& input) {
  const size_t k = next_++;
  if (k >= outputs_->size()) return std::nullopt;
  const InnerOutput& o = (*outputs_)[k];
  if (o.region.get() != region || o.input_sizes != input.to_local().sizes().vec() || region->output_read)
    return std::nullopt;
  return o;
}

void Nest::stood_in(NestedRegion* region, const torch::autograd::Node* node) { stand_ins_.emplace_back(region, node); }

bool Nest::read_stand_ins(const at::Tensor& out, uint64_t first_seq) {
  std::vector<const torch::autograd::Node*> nodes;
  for (const auto& [region, node] : stand_ins_) nodes.push_back(node);
  const std::vector<bool> read = values_read(out, first_seq, nodes);
  bool any = false;
  for (size_t i = 0; i < read.size(); ++i)
    if (read[i]) stand_ins_[i].first->output_read = true, any = true;
  return any;
}

std::vector<bool> values_read(const at::Tensor& out, uint64_t first_seq,
                              const std::vector<const torch::autograd::Node*>& stand_ins) {
  std::vector<bool> read(stand_ins.size(), false);
  if (stand_ins.empty() || !out.grad_fn()) return read;
  auto stand_in_at = [&](const torch::autograd::Node* n) {
    for (size_t i = 0; i < stand_ins.size(); ++i)
      if (stand_ins[i] == n) return static_cast<int>(i);
    return -1;
  };
  // Per node: the stand-ins it reaches through one edge or more, i.e. whose values (or
  // values made from them) it received in the forward.
  std::map<const torch::autograd::Node*, std::set<int>> reach;
  std::function<const std::set<int>&(const torch::autograd::Node*)> visit =
      [&](const torch::autograd::Node* n) -> const std::set<int>& {
    if (auto it = reach.find(n); it != reach.end()) return it->second;
    std::set<int>& r = reach[n];
    if (dynamic_cast<const torch::autograd::AccumulateGrad*>(n) || n->sequence_nr() < first_seq) return r;
    for (const auto& e : n->next_edges()) {
      if (!e.function) continue;
      if (int i = stand_in_at(e.function.get()); i >= 0) r.insert(i);
      const std::set<int>& below = visit(e.function.get());
      r.insert(below.begin(), below.end());
    }
    if (!keeps_no_values(*n))
      for (int i : r) read[i] = true;
    return r;
  };
  visit(out.grad_fn().get());
  return read;
}

}  // namespace hp::memory
