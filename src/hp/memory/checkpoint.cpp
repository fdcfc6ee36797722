#include "hp/memory/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <atomic>
#include <chrono>
#include <set>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/memory/selective_region.h"
#include "hp/parallel/tensor_parallel.h"
#include "hp/tensor/fused_cpu.h"
#include "hp/tensor/random.h"
#include "hp/tensor/weight_outputs.h"

namespace hp {
namespace {

using torch::autograd::variable_list;

std::atomic<int64_t> g_recompute_ns{0};  // recompute_seconds(), in nanoseconds

// Runs the region on (input, params): in forward with the real tensors, in the recompute
// with fresh leaves standing for them.
using RunFn = std::function<at::Tensor(const at::Tensor& input, const std::vector<at::Tensor>& params)>;

// Restores the thread's RNG state when the recompute ends, thrown out of or not.
class RngReplay {
 public:
  RngReplay(bool on, RngState at_forward) : on_(on), outer_(get_rng_state()) {
    if (on_) set_rng_state(at_forward);
  }
  ~RngReplay() {
    if (on_) set_rng_state(outer_);
  }

 private:
  bool on_;
  RngState outer_;
};

struct Region {
  RunFn run;
  at::Tensor input;                 // detached: what the region keeps
  std::vector<at::Tensor> params;   // as the forward read them (views share storage)
  RngState rng;
  bool replay_rng = true;

  variable_list backward(const at::Tensor& grad_output);
};

// Every node the recomputed graph reaches must be its own: an op it ran, the AccumulateGrad
// of one of its leaves, or a sink it made (a node with no outputs: the gradient node of a
// fully_shard unit inside the region, which reduce-scatters what it receives). Anything
// else is a tensor from outside the region whose gradient the recompute cannot deliver.
// Returns whether there are sinks, which only a backward over the whole graph runs.
bool check_closed(const at::Tensor& output, const std::vector<at::Tensor>& leaves, uint64_t first_seq) {
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  bool sinks = false;
  if (output.grad_fn()) todo.push_back(output.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) {
      const bool ours = std::any_of(leaves.begin(), leaves.end(), [&](const at::Tensor& l) {
        return l.defined() && l.unsafeGetTensorImpl() == acc->variable.unsafeGetTensorImpl();
      });
      HP_CHECK(ours) << "checkpoint: the region reads a tensor of shape " << to_string_list(acc->variable.sizes().vec())
                     << " that needs a gradient but is neither its input nor one of its parameters; pass it "
                     << "among the parameters";
      continue;
    }
    HP_CHECK(n->sequence_nr() >= first_seq)
        << "checkpoint: the recomputed region reaches " << n->name() << ", which it did not create (a tensor "
        << "from outside the region: pass it as the input or among the parameters)";
    sinks = sinks || n->num_outputs() == 0;
    for (const auto& e : n->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return sinks;
}

variable_list Region::backward(const at::Tensor& grad_output) {
  variable_list grads(1 + params.size());
  if (!grad_output.defined()) return grads;
  at::AutoGradMode grad_on(true);
  at::Tensor in = input.detach().requires_grad_(input.requires_grad());
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& p : params) leaves.push_back(p.detach().requires_grad_(p.requires_grad()));
  const uint64_t first_seq = at::sequence_number::peek();
  at::Tensor out;
  {
    RngReplay replay(replay_rng, rng);
    memory::RecomputeTimer timer;
    out = run(in, leaves);
  }
  std::vector<at::Tensor> wrt;
  std::vector<size_t> slot;
  if (in.requires_grad()) wrt.push_back(in), slot.push_back(0);
  for (size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].requires_grad()) wrt.push_back(leaves[i]), slot.push_back(1 + i);
  if (wrt.empty() || !out.requires_grad()) return grads;
  std::vector<at::Tensor> own = leaves;
  own.push_back(in);
  const bool sinks = check_closed(out, own, first_seq);
  fused::ReuseSavedInputs reuse;  // the recompute's graph runs once, and only here
  if (sinks) {
    // The whole graph, so that the sinks run too: the gradients land on the fresh leaves.
    torch::autograd::backward({out}, {grad_output}, /*retain_graph=*/false, /*create_graph=*/false);
    for (size_t k = 0; k < wrt.size(); ++k) grads[slot[k]] = wrt[k].grad();
    return grads;
  }
  variable_list got = torch::autograd::grad({out}, wrt, {grad_output}, /*retain_graph=*/false,
                                            /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t k = 0; k < got.size(); ++k) grads[slot[k]] = got[k];
  return grads;
}

struct CheckpointBackward : torch::autograd::Node {
  std::shared_ptr<Region> region;
  variable_list apply(variable_list&& grads) override { return region->backward(grads.at(0)); }
  std::string name() const override { return "CheckpointBackward"; }
  void release_variables() override { region.reset(); }
};

bool shares_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

at::Tensor run_region(RunFn run, const at::Tensor& input, std::vector<at::Tensor> params,
                      const CheckpointOptions& options) {
  HP_CHECK(!WeightOutputRecorder::recording())
      << "checkpoint: a split backward (zero-bubble schedules' I and W) cannot run through a checkpointed region; "
      << "use a schedule without split backwards (1f1b, gpipe, interleaved-1f1b)";
  auto region = std::make_shared<Region>();
  region->rng = get_rng_state();
  region->replay_rng = options.preserve_rng_state;
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = run(input, params);
  }
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (input.requires_grad() ||
                           std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.requires_grad(); }));
  if (!needs_grad) return out;
  // The output gets its own history: an output that aliases an input is copied first.
  bool aliases = shares_storage(out, input);
  for (const at::Tensor& p : params) aliases = aliases || shares_storage(out, p);
  if (aliases) out = out.clone();
  region->input = input.detach();
  region->input.requires_grad_(input.requires_grad());
  for (const at::Tensor& p : params) {
    at::Tensor d = p.detach();
    d.requires_grad_(p.requires_grad());
    region->params.push_back(d);
  }
  region->run = std::move(run);
  std::vector<at::Tensor> inputs{input};
  inputs.insert(inputs.end(), params.begin(), params.end());
  auto node = std::shared_ptr<CheckpointBackward>(new CheckpointBackward(), torch::autograd::deleteNode);
  node->region = region;
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::set_history(out, node);
  return out;
}

// A DTensor standing for `like` with `local` as its data, the gradient-reduction marks kept.
DTensor with_local(const DTensor& like, const at::Tensor& local) {
  DTensor d(local, like.device_mesh(), like.spec());
  std::vector<int> deferred;
  for (int k = 0; k < like.device_mesh().ndim(); ++k)
    if (like.defers_grad_reduction(k)) deferred.push_back(k);
  if (!deferred.empty()) d.defer_grad_reduction(deferred);
  return d;
}

// Puts `values` in `slots` until destroyed.
template <typename T>
class SlotSwap {
 public:
  SlotSwap(const std::vector<T*>& slots, std::vector<T> values) : slots_(slots) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      outer_.push_back(*slots_[i]);
      *slots_[i] = std::move(values[i]);
    }
  }
  ~SlotSwap() {
    for (size_t i = 0; i < slots_.size(); ++i) *slots_[i] = outer_[i];
  }

 private:
  std::vector<T*> slots_;
  std::vector<T> outer_;
};

bool is_selective(const CheckpointOptions& o) { return static_cast<bool>(o.policy) || o.memory_budget.has_value(); }

DTensor selective_checkpoint(const std::function<DTensor(const DTensor&)>& fn, const DTensor& input,
                             const std::vector<DTensor*>& params, const CheckpointOptions& options) {
  if (!at::GradMode::is_enabled()) return fn(input);
  memory::install_saved_tensor_hooks_engine();
  std::vector<DTensor> at_forward;
  for (DTensor* p : params) {
    HP_CHECK(p != nullptr) << "checkpoint: a null parameter slot";
    at_forward.push_back(*p);
  }
  // The replay reads the parameters as the forward did (fully_shard shows them sharded
  // between forwards; its backward hook has gathered them again by then).
  DTensor in = with_local(input, input.to_local().detach());
  auto replay = [fn, params, at_forward, in] {
    SlotSwap<DTensor> swap(params, at_forward);
    fn(in);
  };
  memory::SelectiveRegion::Options o;
  o.policy = options.policy;
  o.memory_budget = options.memory_budget;
  o.replay_rng = options.preserve_rng_state;
  o.swap_tier = options.swap_tier;
  auto region = std::make_shared<memory::SelectiveRegion>(o, std::move(replay));
  region->protect(input.to_local());
  for (DTensor* p : params) region->protect(p->to_local());
  return region->forward([&] { return fn(input); });
}

}  // namespace

memory::RecomputeTimer::~RecomputeTimer() {
  g_recompute_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_)
                        .count();
}

double memory::recompute_seconds() { return 1e-9 * static_cast<double>(g_recompute_ns.load()); }

DTensor memory::checkpoint(const std::function<DTensor(const DTensor&)>& fn, const DTensor& input,
                   const std::vector<DTensor*>& params, const CheckpointOptions& options) {
  if (is_selective(options)) return selective_checkpoint(fn, input, params, options);
  std::vector<DTensor> at_forward;
  std::vector<at::Tensor> locals;
  for (DTensor* p : params) {
    HP_CHECK(p != nullptr) << "checkpoint: a null parameter slot";
    at_forward.push_back(*p);
    locals.push_back(p->to_local());
  }
  auto out_spec = std::make_shared<std::optional<DTensor>>();
  DTensor in_like = input;
  RunFn run = [fn, params, at_forward, in_like, out_spec](const at::Tensor& x, const std::vector<at::Tensor>& ps) {
    std::vector<DTensor> values;
    for (size_t i = 0; i < ps.size(); ++i) values.push_back(with_local(at_forward[i], ps[i]));
    SlotSwap<DTensor> swap(params, std::move(values));
    DTensor out = fn(with_local(in_like, x));
    if (!out_spec->has_value()) *out_spec = out;
    return out.to_local();
  };
  at::Tensor out = run_region(std::move(run), input.to_local(), locals, options);
  const DTensor& like = out_spec->value();
  return DTensor(out, like.device_mesh(), like.spec());
}

at::Tensor memory::checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const std::vector<at::Tensor*>& params, const CheckpointOptions& options) {
  HP_CHECK(!is_selective(options)) << "checkpoint: a selective policy or memory budget chooses among hp's DTensor "
                                   << "ops, and a region on plain tensors runs none; checkpoint it whole";
  std::vector<at::Tensor> locals;
  for (at::Tensor* p : params) {
    HP_CHECK(p != nullptr) << "checkpoint: a null parameter slot";
    locals.push_back(*p);
  }
  RunFn run = [fn, params](const at::Tensor& x, const std::vector<at::Tensor>& ps) {
    SlotSwap<at::Tensor> swap(params, ps);
    return fn(x);
  };
  return run_region(std::move(run), input, locals, options);
}

namespace {

DTensor checkpointed_forward(nn::Module& m, const DTensor& input, const CheckpointOptions& options) {
  return memory::checkpoint([&m](const DTensor& x) { return m.forward(x); }, input, m.parameters(), options);
}

}  // namespace

DTensor memory::checkpoint(nn::Module& module, const DTensor& input, const CheckpointOptions& options) {
  if (module.has_forward_wrapper()) return module(input);
  module.set_forward_wrapper(
      [options](nn::Module& m, const DTensor& x) { return checkpointed_forward(m, x, options); });
  struct Unwrap {
    nn::Module& m;
    ~Unwrap() { m.set_forward_wrapper(nullptr); }
  } unwrap{module};
  return module(input);
}

void checkpoint_wrapper(nn::Module& module, const CheckpointOptions& options) {
  HP_CHECK(!module.has_forward_wrapper()) << "checkpoint_wrapper: the module's forward is already wrapped";
  module.set_forward_wrapper(
      [options](nn::Module& m, const DTensor& x) { return checkpointed_forward(m, x, options); });
}

void checkpoint_wrapper(nn::Module& root, const std::vector<std::string>& patterns, const CheckpointOptions& options) {
  std::vector<std::pair<std::string, nn::Module*>> chosen;
  for (const std::string& pattern : patterns) {
    int matched = 0;
    for (auto& [name, m] : root.named_modules())
      if (name_matches(pattern, name)) {
        ++matched;
        if (std::none_of(chosen.begin(), chosen.end(), [&](auto& c) { return c.second == m; }))
          chosen.emplace_back(name, m);
      }
    HP_CHECK(matched > 0) << "checkpoint_wrapper: pattern '" << pattern << "' matches no module";
  }
  for (auto& [a, ma] : chosen)
    for (auto& [b, mb] : chosen)
      HP_CHECK(a == b || !(a.empty() || b.rfind(a + ".", 0) == 0))
          << "checkpoint_wrapper: '" << b << "' lies inside '" << (a.empty() ? "<root>" : a)
          << "', which is checkpointed too (its forward would be recomputed twice)";
  for (auto& [name, m] : chosen) {
    HP_CHECK(!m->has_forward_wrapper()) << "checkpoint_wrapper: '" << name << "' is already wrapped";
    checkpoint_wrapper(*m, options);
  }
}

CheckpointOptions swap_options(std::shared_ptr<memory::StorageTier> tier) {
  HP_CHECK(tier) << "swap_wrapper: no storage tier";
  CheckpointOptions o;
  o.policy = [](const CheckpointOp&) { return CheckpointPolicy::MUST_SWAP; };
  o.swap_tier = std::move(tier);
  return o;
}

void swap_wrapper(nn::Module& module, std::shared_ptr<memory::StorageTier> tier) {
  checkpoint_wrapper(module, swap_options(std::move(tier)));
}

void swap_wrapper(nn::Module& root, const std::vector<std::string>& patterns,
                  std::shared_ptr<memory::StorageTier> tier) {
  checkpoint_wrapper(root, patterns, swap_options(std::move(tier)));
}

}  // namespace hp
