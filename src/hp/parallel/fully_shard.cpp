#include "hp/parallel/fully_shard.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/collectives.h"
#include "hp/comm/symm/collectives.h"
#include "hp/nn/layers.h"
#include "hp/parallel/fsdp_float8.h"
#include "hp/parallel/fsdp_mesh_dims.h"
#include "hp/parallel/fsdp_param.h"

namespace hp {
namespace parallel {

// What the units under one root share: the order they run in (recorded on the first
// forward, used for prefetching), the one reduce-scatter kept in flight in backward, and
// their send buffers.
struct FSDPRun {
  std::vector<FSDPUnit*> forward_order;   // by pre-forward
  std::vector<FSDPUnit*> backward_order;  // reversed post-forward order
  bool recording = true;
  bool callback_queued = false;
  FSDPUnit* reducing = nullptr;
  comm::Pending reduce;
  FSDPUnit* gathering = nullptr;  // whose all-gather last read the gather send buffers

  static FSDPUnit* after(const std::vector<FSDPUnit*>& order, const FSDPUnit* u) {
    auto it = std::find(order.begin(), order.end(), u);
    return it == order.end() || it + 1 == order.end() ? nullptr : *(it + 1);
  }
  void finish_reduce();
  void finish_backward();

  // A send buffer for an all-gather or reduce-scatter over `g`: in g's symmetric heap when
  // g runs over shared memory, where those collectives read it in place instead of staging
  // it; else one of g's pooled buffers.
  enum class Use { Gather, Reduce };
  at::Tensor send_buffer(const comm::Group& g, int64_t numel, at::ScalarType dtype, at::Device device, Use use);
  // One per group, dtype and use, grown to the largest unit's. The collectives read it
  // while in flight on the progress engine: gathers and reductions have buffers of their
  // own, and a unit packs one only once the collective that last read it has finished
  // (start_gather, finish_reduce). Undefined: none to be had (not over shared memory, or
  // no room), and not asked for again.
  std::map<std::tuple<const comm::Group*, at::ScalarType, Use>, at::Tensor> symmetric_send;
};

at::Tensor FSDPRun::send_buffer(const comm::Group& g, int64_t numel, at::ScalarType dtype, at::Device device,
                                Use use) {
  if (device.is_cpu()) {
    // Every rank asks for the same sizes in the same order, so the collective
    // try_in_place_buffer is reached together.
    auto [it, first] = symmetric_send.try_emplace({&g, dtype, use});
    at::Tensor& s = it->second;
    if (s.defined() && s.numel() >= numel) return s.narrow(0, 0, numel);
    if (first || s.defined()) {
      s = at::Tensor();  // the smaller one goes first: the heap may reuse its room
      s = symm::try_in_place_buffer(numel, dtype, g);
      if (s.defined()) return s;
    }
  }
  return g.buffer(numel, at::TensorOptions().dtype(dtype).device(device));
}

class FSDPUnit : public std::enable_shared_from_this<FSDPUnit> {
 public:
  FSDPUnit(std::vector<FSDPParam> params, std::vector<nn::Linear*> linears, const comm::Group* shard,
           const comm::Group* replicate, FullyShardOptions options)
      : options_(options), params_(std::move(params)), linears_(std::move(linears)), shard_(shard), replicate_(replicate) {
    const at::ScalarType param = params_.empty() ? at::kFloat : params_[0].sharded().scalar_type();
    compute_ = options_.mp_policy.param_dtype.value_or(param);
    reduce_ = options_.mp_policy.reduce_dtype.value_or(compute_);
    if (!params_.empty()) device_ = params_[0].sharded().to_local().device();  // meta in a dry-run
    for (const FSDPParam& p : params_) {
      offsets_.push_back(padded_total_);
      padded_total_ += p.padded_numel();
    }
    run_ = std::make_shared<FSDPRun>();
    if (params_.empty()) return;
    if (auto tier = make_offload_tier(options_.offload_policy, params_[0].sharded().device_mesh().rank()))
      for (FSDPParam& p : params_) {
        HP_CHECK(!p.deferred()) << "fully_shard: parameter '" << p.name() << "' was made inside "
                                << "nn::no_init_parameters(), and an offload policy sends its shard out at once: "
                                << "call nn::init_parameters(model) before fully_shard when offloading";
        p.offload_to(tier, p.name());
      }
  }

  void adopt(const std::shared_ptr<FSDPUnit>& inner) {
    inner->is_root_ = false;
    inner->for_each([&](FSDPUnit& u) { u.run_ = run_; });
    inner_.push_back(inner);
  }
  template <typename F>
  void for_each(F&& f) {
    f(*this);
    for (auto& u : inner_) u->for_each(f);
  }
  bool owns(const DTensor* slot) {
    bool found = false;
    for_each([&](FSDPUnit& u) { found = found || u.slots_.count(slot); });
    return found;
  }
  void set_slots(std::vector<DTensor*> slots) { slots_ = {slots.begin(), slots.end()}; }
  template <typename F>
  void for_each_param(F&& f) {
    for (FSDPParam& p : params_) f(p);
  }
  int64_t unsharded_bytes() const {
    int64_t n = 0;
    for (const FSDPParam& p : params_) n += p.unsharded_bytes();
    return n;
  }
  at::ScalarType compute_dtype() const { return compute_; }
  bool is_root() const { return is_root_; }

  FullyShardOptions options_;
  bool sync_ = true;

  DTensor pre_forward(const DTensor& input);
  DTensor post_forward(const DTensor& output);
  void pre_backward();
  void post_backward(const std::vector<at::Tensor>& grads);
  void start_gather();
  void reshard();
  void finish_reduce(const at::Tensor& reduced);

 private:
  enum class State { Sharded, Gathering, Unsharded };
  void unshard();
  void plan_gather();
  at::Tensor gather_slot(const at::Tensor& flat, size_t i) const;

  std::vector<FSDPParam> params_;
  std::vector<int64_t> offsets_;  // of each parameter's slot in one rank's flat segment (reduce-scatter)
  int64_t padded_total_ = 0;
  // The all-gather's segment: as the reduce-scatter's, in the compute dtype, unless some
  // weights travel in FP8; then bytes, each slot aligned for a view in its own dtype.
  std::vector<nn::Linear*> linears_;    // per parameter: the Linear whose weight it is, or null
  std::optional<Float8Gather> float8_;  // made at the first gather, when the products are set
  at::ScalarType gather_dtype_ = at::kFloat;
  std::vector<at::ScalarType> gather_dtypes_;  // per parameter
  std::vector<int64_t> gather_offsets_;
  int64_t gather_total_ = 0;
  std::vector<at::Tensor> scales_;  // of the gather in flight or done (FP8 parameters)
  const comm::Group* shard_;
  const comm::Group* replicate_;
  at::ScalarType compute_, reduce_;
  c10::Device device_{c10::kCPU};
  std::set<const DTensor*> slots_;
  std::vector<std::shared_ptr<FSDPUnit>> inner_;
  std::shared_ptr<FSDPRun> run_;
  bool is_root_ = true;
  State state_ = State::Sharded;
  comm::Pending gather_;
  std::vector<at::Tensor> accumulated_;  // unsharded gradients while sync is off
};

namespace {

// The autograd node behind a unit's gathered parameters: it runs once all their
// gradients are known, which is the moment to reduce-scatter them.
struct PostBackward : torch::autograd::Node {
  std::weak_ptr<FSDPUnit> unit;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (auto u = unit.lock()) u->post_backward(grads);
    return {};
  }
  std::string name() const override { return "FSDPPostBackward"; }
};

std::mutex registry_mu;
std::map<const nn::Module*, std::weak_ptr<FSDPUnit>>& registry() {
  static std::map<const nn::Module*, std::weak_ptr<FSDPUnit>> units;
  return units;
}

int find_dim(const DeviceMesh& param_mesh, const std::string& name, const DeviceMesh& mesh) {
  const auto& names = param_mesh.dim_names();
  auto it = std::find(names.begin(), names.end(), name);
  HP_CHECK(it != names.end()) << "fully_shard: parameters live on " << param_mesh.to_string()
                              << ", which has no dim '" << name << "' of " << mesh.to_string()
                              << " (build the model on a mesh that includes the data-parallel dims)";
  return static_cast<int>(it - names.begin());
}

}  // namespace

void FSDPRun::finish_reduce() {
  if (!reducing) return;
  FSDPUnit* u = reducing;
  reducing = nullptr;
  u->finish_reduce(reduce.wait());
}

void FSDPRun::finish_backward() {
  finish_reduce();
  for (FSDPUnit* u : forward_order)
    if (u->options_.reshard_after_backward) u->reshard();
  callback_queued = false;
}

void FSDPUnit::plan_gather() {
  float8_.emplace(params_, linears_, compute_);
  gather_dtypes_.clear();
  for (size_t i = 0; i < params_.size(); ++i) gather_dtypes_.push_back(float8_->dtype(i, compute_));
  if (float8_->empty()) {
    gather_dtype_ = compute_, gather_offsets_ = offsets_, gather_total_ = padded_total_;
    return;
  }
  gather_dtype_ = at::kByte;
  const int64_t align = static_cast<int64_t>(c10::elementSize(compute_));
  gather_offsets_.clear();
  gather_total_ = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    gather_offsets_.push_back(gather_total_);
    const int64_t bytes = params_[i].padded_numel() * static_cast<int64_t>(c10::elementSize(gather_dtypes_[i]));
    gather_total_ += (bytes + align - 1) / align * align;
  }
}

// Parameter i's slot in `flat` (the send buffer, or the gathered [shard ranks, segment]),
// viewed as the dtype it travels in.
at::Tensor FSDPUnit::gather_slot(const at::Tensor& flat, size_t i) const {
  const int64_t n = params_[i].padded_numel();
  const int64_t length = gather_dtype_ == at::kByte ? n * static_cast<int64_t>(c10::elementSize(gather_dtypes_[i])) : n;
  return flat.narrow(-1, gather_offsets_[i], length).view(gather_dtypes_[i]);
}

void FSDPUnit::start_gather() {
  if (state_ != State::Sharded || params_.empty()) return;
  // Offloaded shards come in for the pack (and FP8's scales) and go out once packed.
  for (FSDPParam& p : params_)
    if (p.offloaded()) p.bring_in(/*grad=*/false, /*changing=*/false);
  if (!float8_) plan_gather();
  // At most one gather reads the gather buffers: one still in flight (a prefetch that
  // another unit's unshard overtook) finishes first; its result stays with its unit.
  if (run_->gathering && run_->gathering != this && run_->gathering->state_ == State::Gathering)
    run_->gathering->gather_.wait();
  run_->gathering = this;
  // Backward is under way while its callback is queued: gathers then are backward's.
  scales_ = float8_->scales(params_, *shard_, /*forward=*/!run_->callback_queued);
  at::Tensor send = run_->send_buffer(*shard_, gather_total_, gather_dtype_, device_, FSDPRun::Use::Gather);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].pack_shard(gather_slot(send, i), scales_[i]);
  for (FSDPParam& p : params_)
    if (p.offloaded()) p.send_out();
  gather_ = comm::all_gather_async(send, *shard_, 0);
  state_ = State::Gathering;
}

void FSDPUnit::unshard() {
  if (state_ == State::Sharded) start_gather();
  if (state_ != State::Gathering) return;
  at::Tensor gathered = gather_.wait().view({shard_->size(), gather_total_});
  for (size_t i = 0; i < params_.size(); ++i) params_[i].unpack_gathered(gather_slot(gathered, i), scales_[i]);
  gather_ = comm::Pending();
  state_ = State::Unsharded;
}

void FSDPUnit::reshard() {
  if (state_ == State::Gathering) gather_.wait();  // a prefetch nobody used: drain it
  gather_ = comm::Pending();
  for (FSDPParam& p : params_) p.free_unsharded();
  state_ = State::Sharded;
}

DTensor FSDPUnit::pre_forward(const DTensor& input) {
  if (run_->recording) {
    if (is_root_) run_->forward_order.clear(), run_->backward_order.clear();
    run_->forward_order.push_back(this);
  }
  unshard();
  const bool grad = at::GradMode::is_enabled() &&
                    std::any_of(params_.begin(), params_.end(), [](auto& p) { return p.sharded().requires_grad(); });
  std::shared_ptr<PostBackward> node;
  if (grad) {
    node = std::shared_ptr<PostBackward>(new PostBackward(), torch::autograd::deleteNode);
    node->unit = weak_from_this();
  }
  for (FSDPParam& p : params_) {
    at::Tensor alias = p.unsharded_alias();
    if (node) torch::autograd::set_history(alias, node);
    p.show_unsharded(alias);
  }
  if (options_.prefetch && !run_->recording)
    if (FSDPUnit* next = FSDPRun::after(run_->forward_order, this)) next->start_gather();
  // The root casts floating-point inputs to the compute dtype of mixed precision.
  if (is_root_ && input.to_local().is_floating_point() && input.scalar_type() != compute_)
    return DTensor(input.to_local().to(compute_), input.device_mesh(),
                   make_spec(input.sizes(), compute_, input.device_mesh(), input.placements()));
  return input;
}

DTensor FSDPUnit::post_forward(const DTensor& output) {
  for (FSDPParam& p : params_) p.show_sharded();
  if (run_->recording) run_->backward_order.insert(run_->backward_order.begin(), this);
  if (is_root_) run_->recording = false;
  const bool grad = at::GradMode::is_enabled() && output.requires_grad();
  // The root would be gathered again at once for backward: it keeps its parameters.
  if (!grad || (options_.reshard_after_forward && !is_root_)) reshard();
  if (grad) {
    std::weak_ptr<FSDPUnit> self = weak_from_this();
    output.to_local().register_hook([self](const at::Tensor&) {
      if (auto u = self.lock()) u->pre_backward();
    });
  }
  return output;
}

void FSDPUnit::pre_backward() {
  if (!run_->callback_queued) {
    std::shared_ptr<FSDPRun> run = run_;
    torch::autograd::Engine::get_default_engine().queue_callback([run] { run->finish_backward(); });
    run_->callback_queued = true;
  }
  unshard();
  if (options_.prefetch)
    if (FSDPUnit* next = FSDPRun::after(run_->backward_order, this)) next->start_gather();
}

void FSDPUnit::post_backward(const std::vector<at::Tensor>& grads) {
  HP_CHECK(grads.size() == params_.size()) << "fully_shard: " << grads.size() << " gradients for "
                                           << params_.size() << " parameters";
  accumulated_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    at::Tensor g = grads[i].to(reduce_);
    accumulated_[i] = accumulated_[i].defined() ? accumulated_[i].add_(g) : g.clone();
  }
  if (sync_) {
    // One rank's segment per row; rank r receives the sum of row r.
    run_->finish_reduce();  // at most one reduction in flight: bounded memory, and its buffer free
    at::Tensor send =
        run_->send_buffer(*shard_, shard_->size() * padded_total_, reduce_, device_, FSDPRun::Use::Reduce);
    at::Tensor rows = send.view({shard_->size(), padded_total_});
    for (size_t i = 0; i < params_.size(); ++i) {
      if (accumulated_[i].defined())
        params_[i].pack_grad(accumulated_[i], rows, offsets_[i]);
      else
        rows.narrow(1, offsets_[i], params_[i].padded_numel()).zero_();
    }
    accumulated_.clear();
    comm::Pending pending = comm::reduce_scatter_async(send, *shard_, 0);
    if (replicate_) {
      const comm::Group* rg = replicate_;
      pending = std::move(pending).then([rg](at::Tensor t) { return comm::all_reduce_(t, *rg); },
                                        "HSDP all-reduce over " + rg->describe());
    }
    run_->reduce = std::move(pending);
    run_->reducing = this;
  }
  if (options_.reshard_after_backward) reshard();
}

void FSDPUnit::finish_reduce(const at::Tensor& reduced) {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].accumulate_grad(reduced, offsets_[i]);
}

// The offloaded parameters under some roots, found by their module slots.
class FSDPOffloaded : public memory::OffloadedParameters {
 public:
  explicit FSDPOffloaded(std::vector<std::shared_ptr<FSDPUnit>> roots) : roots_(std::move(roots)) {
    for (const auto& root : roots_)
      root->for_each([this](FSDPUnit& u) {
        u.for_each_param([this](FSDPParam& p) {
          if (p.offloaded()) by_slot_[p.slot()] = &p;
        });
      });
  }
  void bring_in(const std::vector<DTensor*>& params) override {
    for (DTensor* s : params)
      if (FSDPParam* p = find(s)) p->bring_in(/*grad=*/true, /*changing=*/true);
  }
  void bring_in_grads(const std::vector<DTensor*>& params, bool changing) override {
    for (DTensor* s : params)
      if (FSDPParam* p = find(s)) p->bring_in_grad(changing);
  }
  void send_out(const std::vector<DTensor*>& params) override {
    for (DTensor* s : params)
      if (FSDPParam* p = find(s)) p->send_out();
  }

 private:
  FSDPParam* find(const DTensor* slot) const {
    auto it = by_slot_.find(slot);
    return it == by_slot_.end() ? nullptr : it->second;
  }
  std::vector<std::shared_ptr<FSDPUnit>> roots_;  // keep the parameters alive
  std::map<const DTensor*, FSDPParam*> by_slot_;
};

}  // namespace parallel

void FSDPModule::bring_in_offloaded() {
  unit_->for_each([](parallel::FSDPUnit& u) {
    u.for_each_param([](parallel::FSDPParam& p) {
      if (p.offloaded()) p.bring_in(/*grad=*/true, /*changing=*/true);
    });
  });
}
std::shared_ptr<memory::OffloadedParameters> FSDPModule::offloaded_parameters() const {
  return hp::offloaded_parameters(std::vector<FSDPModule>{*this});
}

std::shared_ptr<memory::OffloadedParameters> offloaded_parameters(const std::vector<FSDPModule>& roots) {
  std::vector<std::shared_ptr<parallel::FSDPUnit>> units;
  for (const FSDPModule& root : roots) units.push_back(root.unit_);
  return std::make_shared<parallel::FSDPOffloaded>(std::move(units));
}

void FSDPModule::set_requires_gradient_sync(bool on) {
  unit_->for_each([on](parallel::FSDPUnit& u) { u.sync_ = on; });
}
void FSDPModule::set_reshard_after_forward(bool on) {
  unit_->for_each([on](parallel::FSDPUnit& u) { u.options_.reshard_after_forward = on; });
}
void FSDPModule::set_reshard_after_backward(bool on) {
  unit_->for_each([on](parallel::FSDPUnit& u) { u.options_.reshard_after_backward = on; });
}
void FSDPModule::set_prefetch(bool on) {
  unit_->for_each([on](parallel::FSDPUnit& u) { u.options_.prefetch = on; });
}
int64_t FSDPModule::unsharded_bytes() const {
  int64_t n = 0;
  unit_->for_each([&n](parallel::FSDPUnit& u) { n += u.unsharded_bytes(); });
  return n;
}

FSDPModule fully_shard(nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options) {
  using parallel::FSDPUnit;
  HP_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2)
      << "fully_shard: the mesh must have 1 dim (FSDP) or 2 dims (replicate, shard: HSDP), got " << mesh.to_string();
  // Units already made inside this module become part of this one.
  std::vector<std::shared_ptr<FSDPUnit>> inner;
  {
    std::lock_guard<std::mutex> lock(parallel::registry_mu);
    for (auto& [name, m] : module.named_modules()) {
      auto it = parallel::registry().find(m);
      if (it == parallel::registry().end() || m == &module) continue;
      if (auto u = it->second.lock(); u && u->is_root()) inner.push_back(u);
    }
    HP_CHECK(!parallel::registry().count(&module) || parallel::registry()[&module].expired())
        << "fully_shard: this module is already sharded";
  }
  std::map<const DTensor*, nn::Linear*> linear_of;  // by weight slot: FP8 all-gather looks at their products
  for (auto& [name, m] : module.named_modules())
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) linear_of[&lin->weight()] = lin;
  std::vector<parallel::FSDPParam> params;
  std::vector<DTensor*> slots;
  std::vector<nn::Linear*> linears;
  for (auto& [name, slot] : module.named_parameters()) {
    if (std::any_of(inner.begin(), inner.end(), [&](auto& u) { return u->owns(slot); })) continue;
    const DeviceMesh& pm = slot->device_mesh();
    const parallel::FSDPMeshDims shard = parallel::fsdp_mesh_dims(pm, mesh, mesh.ndim() - 1);
    const int replicate = mesh.ndim() == 2 ? parallel::find_dim(pm, mesh.dim_names()[0], mesh) : -1;
    const at::ScalarType compute = options.mp_policy.param_dtype.value_or(slot->scalar_type());
    params.emplace_back(name, slot, shard.param_dims, shard.group->ranks(), replicate, compute);
    slots.push_back(slot);
    linears.push_back(linear_of.count(slot) ? linear_of[slot] : nullptr);
  }
  const comm::Group* shard_group = nullptr;
  const comm::Group* replicate_group = nullptr;
  if (!slots.empty()) {
    const DeviceMesh& pm = slots[0]->device_mesh();
    for (DTensor* s : slots)
      HP_CHECK(s->device_mesh() == pm) << "fully_shard: parameters of one unit live on different meshes, "
                                       << pm.to_string() << " and " << s->device_mesh().to_string();
    shard_group = parallel::fsdp_mesh_dims(pm, mesh, mesh.ndim() - 1).group;
    if (mesh.ndim() == 2) replicate_group = &pm.group(parallel::find_dim(pm, mesh.dim_names()[0], mesh));
  }
  auto unit = std::make_shared<FSDPUnit>(std::move(params), std::move(linears), shard_group, replicate_group, options);
  unit->set_slots(slots);
  for (auto& u : inner) unit->adopt(u);
  {
    std::lock_guard<std::mutex> lock(parallel::registry_mu);
    parallel::registry()[&module] = unit;
  }
  std::weak_ptr<FSDPUnit> weak = unit;
  module.register_forward_pre_hook([unit](nn::Module&, const DTensor& x) { return unit->pre_forward(x); });
  module.register_forward_hook(
      [weak](nn::Module&, const DTensor&, const DTensor& y) { return weak.lock()->post_forward(y); });
  return FSDPModule(unit);
}

}  // namespace hp
