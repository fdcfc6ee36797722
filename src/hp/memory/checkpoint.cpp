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
#include "hp/memory/nested_regions.h"
#include "hp/memory/region_ops.h"
#include "hp/memory/selective_region.h"
#include "hp/memory/storage_map.h"
#include "hp/memory/token_chunk_check.h"
#include "hp/parallel/tensor_parallel.h"
#include "hp/tensor/random.h"
#include "hp/tensor/weight_outputs.h"

namespace hp {
namespace {

using torch::autograd::variable_list;

std::atomic<int64_t> g_recompute_ns{0};  // recompute_seconds(), in nanoseconds
std::atomic<int64_t> g_left_out{0};       // products_left_out()

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
  // As the forward read them (views share storage), not detached: a parameter's own grad()
  // is where a lent gradient accumulates.
  std::vector<at::Tensor> params;
  RngState rng;
  bool replay_rng = true;
  int token_chunks = 1;
  memory::RegionOps ops;  // what its forward learned of its ops
  std::shared_ptr<memory::NestedRegion> self;  // the wrapper's, where there is one
  std::vector<memory::InnerOutput> inner;  // the full regions its forward ran inside it

  variable_list backward(const at::Tensor& grad_output);
  // The recompute and backward of `in` (a fresh leaf: the input, or a chunk of its rows)
  // with the gradient `grad_out`, adding into the grad() of `in` and of the leaves.
  void backward_rows(const at::Tensor& in, const std::vector<at::Tensor>& leaves, const at::Tensor& grad_out);
};

// token_chunks splits a region's rows: the tokens of [tokens, dim], or of [batch, seq, ...,
// dim] the sequences (dim 0) and each sequence's tokens (the dimension before the last). A
// chunk is whole sequences, or a range of one sequence's tokens, so that a chunk of a
// contiguous tensor is contiguous. A region whose output holds other tokens of each
// sequence than its input (one that ends in sequence parallelism's reduce-scatter) is split
// into whole sequences only.
struct RowChunk {
  int64_t seq_begin, seqs, token_begin, tokens;  // tokens 0: all of them
};

std::vector<RowChunk> row_chunks(const at::Tensor& t, int chunks, bool split_sequences) {
  const int64_t seqs = t.dim() == 2 ? 1 : t.size(0), tokens = t.size(t.dim() - 2);
  std::vector<RowChunk> out;
  if (!split_sequences) {
    const int64_t per = (seqs + chunks - 1) / chunks;
    for (int64_t s = 0; s < seqs; s += per) out.push_back({s, std::min(per, seqs - s), 0, 0});
    return out;
  }
  const int64_t per = (seqs * tokens + chunks - 1) / chunks;  // rows per chunk
  if (per >= tokens) {
    const int64_t whole = per / tokens;
    for (int64_t s = 0; s < seqs; s += whole) out.push_back({s, std::min(whole, seqs - s), 0, 0});
  } else {
    for (int64_t s = 0; s < seqs; ++s)
      for (int64_t b = 0; b < tokens; b += per) out.push_back({s, 1, b, std::min(per, tokens - b)});
  }
  return out;
}

at::Tensor rows_of(const at::Tensor& t, const RowChunk& c) {
  at::Tensor r = c.tokens > 0 ? t.narrow(t.dim() - 2, c.token_begin, c.tokens) : t;
  return t.dim() == 2 ? r : r.narrow(0, c.seq_begin, c.seqs);
}

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
  // Fresh leaves stand for the parameters. A parameter that is a leaf and has a gradient
  // lends it to its leaf: the recompute adds into it in place, as the run without
  // checkpointing does, so no copy of the region's weight gradients lives through its
  // backward, and this node hands none on (their AccumulateGrad still runs, after it, with
  // its hooks). The others (fully_shard's gathered views, a first backward) go through it.
  std::vector<at::Tensor> leaves;
  std::vector<bool> lent;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    at::Tensor leaf = p.detach().requires_grad_(p.requires_grad());
    lent.push_back(p.requires_grad() && p.is_leaf() && p.grad().defined());
    if (lent.back()) leaf.mutable_grad() = p.grad();
    leaves.push_back(std::move(leaf));
  }
  auto fresh = [&](const at::Tensor& t) { return t.detach().requires_grad_(input.requires_grad()); };
  if (token_chunks == 1) {
    at::Tensor in = fresh(input);
    backward_rows(in, leaves, grad_output);
    grads[0] = in.grad();
  } else {
    // One chunk of rows at a time: only one chunk's activations are alive at once.
    if (input.requires_grad()) grads[0] = at::empty_like(input);
    for (const RowChunk& c : row_chunks(input, token_chunks, ops.split_sequences)) {
      at::Tensor in = fresh(rows_of(input, c));
      backward_rows(in, leaves, rows_of(grad_output, c));
      if (!grads[0].defined()) continue;
      at::Tensor rows_grad = rows_of(grads[0], c);
      in.grad().defined() ? rows_grad.copy_(in.grad()) : rows_grad.zero_();
    }
  }
  for (size_t i = 0; i < leaves.size(); ++i)
    if (!lent[i]) grads[1 + i] = leaves[i].grad();
  return grads;
}

void Region::backward_rows(const at::Tensor& in, const std::vector<at::Tensor>& leaves, const at::Tensor& grad_out) {
  const uint64_t first_seq = at::sequence_number::peek();
  at::Tensor out;
  for (bool again = true; again;) {  // again when a stand-in's output turns out to be read
    memory::Nest nest(memory::Nest::Phase::Recompute, &inner);
    RngReplay replay(replay_rng, rng);
    memory::RecomputeTimer timer;
    std::optional<memory::GraphOnlyRecompute> graph_only;
    if (!ops.graph_only.empty() && !observing()) graph_only.emplace(ops.graph_only, leaves);
    out = run(in, leaves);
    again = nest.read_stand_ins(out, first_seq);
    if (graph_only && graph_only->read(out, first_seq)) {  // code the forward did not see reads one
      again = true;
      ops.graph_only.clear();
      if (self) self->graph_only_read = true;
    } else if (graph_only) {
      g_left_out += graph_only->stood_in();
    }
  }
  std::vector<at::Tensor> wrt;
  if (in.requires_grad()) wrt.push_back(in);
  for (const at::Tensor& leaf : leaves)
    if (leaf.requires_grad()) wrt.push_back(leaf);
  if (wrt.empty() || !out.requires_grad()) return;
  std::vector<at::Tensor> own = leaves;
  own.push_back(in);
  const bool sinks = check_closed(out, own, first_seq);
  HP_CHECK(!sinks || token_chunks == 1) << "checkpoint: token_chunks cannot split a region that holds a fully_shard "
                                        << "unit (its gradients would be reduced once per chunk); checkpoint it whole";
  // With sinks the whole graph, so that they run too.
  torch::autograd::backward({out}, {grad_out}, /*retain_graph=*/false, /*create_graph=*/false,
                            sinks ? std::vector<at::Tensor>{} : wrt);
}

struct CheckpointBackward : torch::autograd::Node {
  std::shared_ptr<Region> region;
  variable_list apply(variable_list&& grads) override {
    HP_CHECK(region) << "checkpoint: a backward through a checkpointed region that already ran its backward (pass "
                        "retain_graph = true to the first to run it again) or whose backward failed";
    try {
      return region->backward(grads.at(0));
    } catch (...) {
      region.reset();  // what it holds may lead back to this node: a failed backward frees it
      throw;
    }
  }
  std::string name() const override { return "CheckpointBackward"; }
  void release_variables() override { region.reset(); }
};

bool shares_storage(const at::Tensor& a, const at::Tensor& b) {
  return memory::storage_of(a) != nullptr && memory::storage_of(a) == memory::storage_of(b);
}

// A region split into token chunks must treat its rows alone and draw nothing from the RNG
// (a chunk's draw would not be the slice of the whole one's). Returns whether a sequence's
// tokens may be split: whether the output holds the input's.
bool check_token_chunks(const at::Tensor& input, const at::Tensor& out, RngState at_start) {
  const RngState now = get_rng_state();
  HP_CHECK(now.seed == at_start.seed && now.offset == at_start.offset)
      << "checkpoint: token_chunks needs a region that draws no random numbers (dropout), and this one does: a "
      << "chunk's recompute would draw different ones";
  const int64_t nd = input.dim();
  auto same_leading = [&](int64_t dims) {
    return out.dim() == nd && input.sizes().slice(0, dims) == out.sizes().slice(0, dims);
  };
  const bool same_rows = nd >= 2 && same_leading(nd - 1), same_sequences = nd >= 3 && same_leading(nd - 2);
  HP_CHECK(same_rows || same_sequences)
      << "checkpoint: token_chunks splits a region's rows (every dimension but the last, or at least the sequences, "
      << "every dimension but the last two), so its input and output must have the same; got input "
      << to_string_list(input.sizes().vec()) << ", output " << to_string_list(out.sizes().vec());
  return same_rows;
}

// How a full region runs, besides its function and options.
struct RegionSetup {
  // The region runs hp's DTensor ops: its forward observes them, to check token_chunks
  // (token_chunk_check.h) and to find what the recompute may leave out (region_ops.h). A
  // region on plain tensors is trusted to treat its rows alone.
  bool hp_ops = false;
  // A nested region in a recompute (nested_regions.h): its forward does not run, this
  // uninitialised tensor in the forward's layout is its output, and `stand_in_ops` what
  // that forward learned.
  at::Tensor stand_in;
  memory::RegionOps stand_in_ops;
  std::shared_ptr<memory::NestedRegion> self;  // the wrapper's region, where there is one
  memory::RegionOps* learned = nullptr;        // gets what the forward learned
};

// Runs the region without keeping its activations and gives its output the backward node
// that recomputes them.
at::Tensor run_region(RunFn run, const at::Tensor& input, std::vector<at::Tensor> params,
                      const CheckpointOptions& options, const RegionSetup& setup = {}) {
  HP_CHECK(!WeightOutputRecorder::recording())
      << "checkpoint: a split backward (zero-bubble schedules' I and W) cannot run through a checkpointed region; "
      << "use a schedule without split backwards (1f1b, gpipe, interleaved-1f1b)";
  auto region = std::make_shared<Region>();
  region->rng = get_rng_state();
  region->replay_rng = options.preserve_rng_state;
  region->token_chunks = options.token_chunks;
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (input.requires_grad() ||
                           std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.requires_grad(); }));
  region->self = setup.self;
  at::Tensor out;
  if (setup.stand_in.defined() && needs_grad) {
    out = setup.stand_in;
    region->ops = setup.stand_in_ops;
  } else {
    memory::Nest nest(memory::Nest::Phase::Forward, &region->inner);
    at::NoGradGuard no_grad;
    std::optional<memory::TokenChunkCheck> rows;
    if (setup.hp_ops && options.token_chunks > 1) rows.emplace(input);
    std::optional<memory::ForwardOps> ops;
    // Without gradients, for the stand-in of a nested region that a recompute will run.
    if (setup.hp_ops && (needs_grad || setup.learned) && !(setup.self && setup.self->graph_only_read))
      ops.emplace(params);
    out = run(input, params);
    if (rows) region->ops.split_sequences = rows->tokens_apart(out);
    if (ops) region->ops.graph_only = ops->graph_only(out);
  }
  if (options.token_chunks > 1)
    region->ops.split_sequences = check_token_chunks(input, out, region->rng) && region->ops.split_sequences;
  if (setup.learned) *setup.learned = region->ops;
  if (!needs_grad) return out;
  // The output gets its own history: an output that aliases an input is copied first.
  bool aliases = shares_storage(out, input);
  for (const at::Tensor& p : params) aliases = aliases || shares_storage(out, p);
  if (aliases) out = out.clone();
  region->input = input.detach();
  region->input.requires_grad_(input.requires_grad());
  region->params = params;
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
// `local` may be a chunk of like's local rows (token_chunks): the global shape shrinks
// with it, by as many times as the mesh shards each dimension (evenly: checked).
DTensor with_local(const DTensor& like, const at::Tensor& local) {
  ShardSpec spec = like.spec();
  if (local.sizes() != like.to_local().sizes()) {
    std::vector<int64_t> shape = like.sizes();
    for (int dim = 0; dim < local.dim(); ++dim) {
      if (local.size(dim) == like.to_local().size(dim)) continue;
      int64_t ways = 1;
      for (int k = 0; k < like.device_mesh().ndim(); ++k)
        if (like.placements()[k].is_shard(dim)) ways *= like.device_mesh().size(k);
      HP_CHECK(shape[dim] == like.to_local().size(dim) * ways)
          << "checkpoint: token_chunks splits the rows of a region whose input is unevenly sharded along dimension "
          << dim << " (" << shape[dim] << " over " << ways
          << " ranks); use a size the mesh divides, or no token_chunks";
      shape[dim] = local.size(dim) * ways;
    }
    spec = make_spec(shape, local.scalar_type(), like.device_mesh(), like.placements());
  }
  DTensor d(local, like.device_mesh(), spec);
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

bool is_selective(const CheckpointOptions& o) {
  HP_CHECK(o.token_chunks >= 1) << "checkpoint: token_chunks must be at least 1, got " << o.token_chunks;
  const bool selective = static_cast<bool>(o.policy) || o.memory_budget.has_value();
  HP_CHECK(!selective || o.token_chunks == 1) << "checkpoint: token_chunks splits a fully recomputed region; a "
                                              << "selective policy or memory budget keeps outputs of the whole one";
  HP_CHECK(o.swap_read_ahead >= 0) << "checkpoint: swap_read_ahead is a number of bytes, got " << o.swap_read_ahead;
  HP_CHECK(selective || !o.release_at_next_region)
      << "checkpoint: release_at_next_region defers what a selective region drops; a full region (no policy, no "
         "budget) keeps only its input";
  return selective;
}

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
  o.release_at_next_region = options.release_at_next_region;
  o.swap_read_ahead = options.swap_read_ahead;
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

int64_t memory::products_left_out() { return g_left_out.load(); }

namespace {

// A full region on DTensors; with `stand_in`, one standing in for a nested region. `self`
// and `learned` as in RegionSetup.
DTensor full_checkpoint(const std::function<DTensor(const DTensor&)>& fn, const DTensor& input,
                        const std::vector<DTensor*>& params, const CheckpointOptions& options,
                        const memory::InnerOutput* stand_in = nullptr,
                        std::shared_ptr<memory::NestedRegion> self = nullptr, memory::RegionOps* learned = nullptr) {
  std::vector<DTensor> at_forward;
  std::vector<at::Tensor> locals;
  for (DTensor* p : params) {
    HP_CHECK(p != nullptr) << "checkpoint: a null parameter slot";
    at_forward.push_back(*p);
    locals.push_back(p->to_local());
  }
  auto out_spec = std::make_shared<std::optional<DTensor>>();
  RegionSetup setup;
  setup.hp_ops = true;
  setup.self = std::move(self);
  setup.learned = learned;
  if (stand_in) {
    *out_spec = stand_in->like;
    setup.stand_in = at::empty_strided(stand_in->sizes, stand_in->strides, stand_in->options);
    setup.stand_in_ops = stand_in->ops;
  }
  DTensor in_like = input;
  RunFn run = [fn, params, at_forward, in_like, out_spec](const at::Tensor& x, const std::vector<at::Tensor>& ps) {
    std::vector<DTensor> values;
    for (size_t i = 0; i < ps.size(); ++i) values.push_back(with_local(at_forward[i], ps[i]));
    SlotSwap<DTensor> swap(params, std::move(values));
    DTensor out = fn(with_local(in_like, x));
    if (!out_spec->has_value()) *out_spec = out;
    return out.to_local();
  };
  at::Tensor out = run_region(std::move(run), input.to_local(), locals, options, setup);
  const DTensor& like = out_spec->value();
  return DTensor(out, like.device_mesh(), like.spec());
}

}  // namespace

DTensor memory::checkpoint(const std::function<DTensor(const DTensor&)>& fn, const DTensor& input,
                           const std::vector<DTensor*>& params, const CheckpointOptions& options) {
  if (is_selective(options)) return selective_checkpoint(fn, input, params, options);
  return full_checkpoint(fn, input, params, options);
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

// `self` is the wrapper's own: what the regions it runs inside (nested_regions.h) know of it.
DTensor checkpointed_forward(nn::Module& m, const DTensor& input, const CheckpointOptions& options,
                             const std::shared_ptr<memory::NestedRegion>& self) {
  auto fn = [&m](const DTensor& x) { return m.forward(x); };
  if (is_selective(options)) return selective_checkpoint(fn, input, m.parameters(), options);
  memory::Nest* nest = memory::Nest::current();
  if (nest && nest->phase() == memory::Nest::Phase::Recompute)
    if (std::optional<memory::InnerOutput> like = nest->stand_in(self.get(), input)) {
      DTensor out = full_checkpoint(fn, input, m.parameters(), options, &*like, self);
      if (out.to_local().grad_fn()) {  // else it ran: nothing needed its gradient
        nest->stood_in(self.get(), out.to_local().grad_fn().get());
        set_rng_state(like->rng_after);  // as if its forward had drawn
      }
      return out;
    }
  const bool nested = nest && nest->phase() == memory::Nest::Phase::Forward;
  memory::RegionOps learned;
  DTensor out = full_checkpoint(fn, input, m.parameters(), options, nullptr, self, nested ? &learned : nullptr);
  if (nested) nest->record(self, input, out, std::move(learned));
  return out;
}

void wrap(nn::Module& module, const CheckpointOptions& options) {
  auto self = std::make_shared<memory::NestedRegion>();
  module.set_forward_wrapper(
      [options, self](nn::Module& m, const DTensor& x) { return checkpointed_forward(m, x, options, self); });
}

}  // namespace

DTensor memory::checkpoint(nn::Module& module, const DTensor& input, const CheckpointOptions& options) {
  if (module.has_forward_wrapper()) return module(input);
  wrap(module, options);
  struct Unwrap {
    nn::Module& m;
    ~Unwrap() { m.set_forward_wrapper(nullptr); }
  } unwrap{module};
  return module(input);
}

void checkpoint_wrapper(nn::Module& module, const CheckpointOptions& options) {
  HP_CHECK(!module.has_forward_wrapper()) << "checkpoint_wrapper: the module's forward is already wrapped";
  wrap(module, options);
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
          << "', which this call checkpoints too; wrap a region inside another with its own call (e.g. with "
          << "token_chunks)";
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
