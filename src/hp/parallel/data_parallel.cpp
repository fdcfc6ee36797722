#include "hp/parallel/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/symm/collectives.h"

namespace hp {
namespace parallel {

struct Bucket {
  std::vector<DTensor*> params;
  std::vector<int64_t> offsets;
  at::Tensor flat;  // kept across steps: no fresh pages per step
  const comm::Group* group = nullptr;
  int waiting = 0;  // gradients not yet accumulated in this backward
  std::optional<comm::Pending> pending;
};

struct DDPState {
  std::vector<Bucket> buckets;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // autograd holds them weakly
  std::vector<DeviceMesh> flattened;  // groups over several dims, kept alive
  bool sync = true;
  bool callback_queued = false;

  void ready(Bucket& b) {
    if (!sync) return;
    if (!callback_queued) {
      callback_queued = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finish(); });
    }
    if (--b.waiting == 0) launch(b);
  }

  void launch(Bucket& b) {
    for (size_t i = 0; i < b.params.size(); ++i) {
      at::Tensor slice = b.flat.narrow(0, b.offsets[i], b.params[i]->to_local().numel());
      const at::Tensor& g = b.params[i]->to_local().grad();
      if (g.defined())
        slice.view(g.sizes()).copy_(g);
      else
        slice.zero_();  // unused in this step: contributes nothing
    }
    b.pending = comm::all_reduce_async(b.flat, *b.group);
  }

  // End of backward: every bucket reduced (a bucket with unused parameters goes now),
  // the sums copied back into the gradients.
  void finish() {
    callback_queued = false;
    for (Bucket& b : buckets) {
      if (!b.pending) launch(b);
      b.pending->wait();
      b.pending.reset();
      b.waiting = static_cast<int>(b.params.size());
      for (size_t i = 0; i < b.params.size(); ++i) {
        at::Tensor local = b.params[i]->to_local();
        at::Tensor sum = b.flat.narrow(0, b.offsets[i], local.numel()).view(local.sizes());
        if (local.grad().defined())
          local.mutable_grad().copy_(sum);
        else
          local.mutable_grad() = sum.clone();
      }
    }
  }
};

}  // namespace parallel

namespace {

// Replicas start equal, as PyTorch's DDP makes them: one broadcast per bucket, through
// the bucket's own buffer, from the group's rank 0.
void broadcast_from_first_replica(parallel::Bucket& b) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < b.params.size(); ++i) {
    const at::Tensor& p = b.params[i]->to_local();
    b.flat.narrow(0, b.offsets[i], p.numel()).copy_(p.reshape(-1));
  }
  comm::broadcast_(b.flat, *b.group, 0);
  for (size_t i = 0; i < b.params.size(); ++i) {
    const at::Tensor& p = b.params[i]->to_local();
    p.copy_(b.flat.narrow(0, b.offsets[i], p.numel()).view(p.sizes()));
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, const DeviceMesh& mesh, DDPOptions options)
    : state_(std::make_shared<parallel::DDPState>()) {
  for (auto& [name, p] : module.named_parameters())
    HP_CHECK(!awaits_init(*p)) << not_drawn_yet("DistributedDataParallel: parameter '" + name + "'", "first");
  auto params = module.parameters();
  std::reverse(params.begin(), params.end());  // backward meets the last parameters first
  std::vector<std::pair<DTensor*, const comm::Group*>> reduced;  // and the group summing each
  for (DTensor* p : params) {
    const DeviceMesh& pm = p->device_mesh();
    // Summed over the dims of `mesh` that replicate p; a dim that shards it (experts over
    // ep) holds other parameters on each rank, nothing to sum.
    std::vector<int> dims;
    std::vector<std::string> dim_names;
    for (const std::string& name : mesh.dim_names()) {
      const auto& names = pm.dim_names();
      auto it = std::find(names.begin(), names.end(), name);
      HP_CHECK(it != names.end()) << "DistributedDataParallel: parameters live on " << pm.to_string()
                                  << ", which has no dim '" << name << "' of " << mesh.to_string();
      const int d = static_cast<int>(it - names.begin());
      HP_CHECK(!p->placements()[d].is_partial()) << "DistributedDataParallel: a parameter is Partial on dim '" << name << "'";
      if (p->placements()[d].is_shard()) continue;
      dims.push_back(d);
      dim_names.push_back(name);
    }
    if (dims.empty()) continue;
    p->defer_grad_reduction(dims);
    const comm::Group* group = nullptr;
    if (dims.size() == 1) {
      group = &pm.group(dims[0]);
    } else {
      state_->flattened.push_back(pm.submesh(dim_names).flatten());
      group = &state_->flattened.back().group(0);
    }
    reduced.emplace_back(p, group);
  }
  const int64_t cap = static_cast<int64_t>(options.bucket_cap_mb * (1 << 20));
  const int64_t first_cap = std::min(cap, static_cast<int64_t>(options.first_bucket_cap_mb * (1 << 20)));
  int64_t across_hosts_cap = cap;
  if (options.min_buckets > 1) {  // of the gradients reduced here, not those of sharded parameters
    int64_t total = 0;
    for (auto [p, group] : reduced) total += p->to_local().numel() * p->to_local().element_size();
    const auto floor = static_cast<int64_t>(options.min_bucket_mb * (1 << 20));
    across_hosts_cap = std::min(cap, std::max(floor, total / options.min_buckets));
  }
  int64_t bytes = 0;
  for (auto [p, group] : reduced) {
    auto& buckets = state_->buckets;
    const int64_t size = p->to_local().numel() * p->to_local().element_size();
    const int64_t later_cap = group->on_one_host() ? cap : across_hosts_cap;
    if (buckets.empty() || bytes + size > (buckets.size() == 1 ? first_cap : later_cap) || buckets.back().group != group ||
        buckets.back().flat.scalar_type() != p->scalar_type()) {
      buckets.emplace_back();
      buckets.back().group = group;
      buckets.back().flat = at::empty({0}, p->to_local().options());
      bytes = 0;
    }
    parallel::Bucket& b = buckets.back();
    b.params.push_back(p);
    b.offsets.push_back(b.flat.numel());
    b.flat = at::empty({b.flat.numel() + p->to_local().numel()}, b.flat.options());
    bytes += size;
  }
  // Buckets of a group on one host live in its symmetric heap, where the all-reduce reads
  // them in place instead of staging them; private memory where the heap has no room.
  for (parallel::Bucket& b : state_->buckets)
    if (at::Tensor s = symm::try_in_place_buffer(b.flat.numel(), b.flat.scalar_type(), *b.group); s.defined())
      b.flat = s;
  if (options.init_sync)
    for (parallel::Bucket& b : state_->buckets) broadcast_from_first_replica(b);
  for (size_t bi = 0; bi < state_->buckets.size(); ++bi) {
    parallel::Bucket& b = state_->buckets[bi];
    b.waiting = static_cast<int>(b.params.size());
    for (DTensor* p : b.params) {
      auto acc = torch::autograd::impl::grad_accumulator(p->to_local());
      HP_CHECK(acc) << "DistributedDataParallel: a parameter does not require grad";
      std::weak_ptr<parallel::DDPState> weak = state_;
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, bi](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
            if (auto state = weak.lock()) state->ready(state->buckets[bi]);
            return out;
          }));
      state_->accumulators.push_back(std::move(acc));
    }
  }
}

void DistributedDataParallel::set_requires_gradient_sync(bool on) { state_->sync = on; }
int DistributedDataParallel::num_buckets() const { return static_cast<int>(state_->buckets.size()); }

}  // namespace hp
