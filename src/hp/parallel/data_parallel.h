// Data parallelism with replicated parameters (our DDP): gradients are summed over the
// data-parallel mesh dims in buckets, flat buffers of about `bucket_cap_mb` filled in the
// order backward produces gradients (parameters in reverse), each bucket's all-reduce
// launched as soon as its last gradient is accumulated, so that communication overlaps
// the rest of backward. The reduced gradients are in place when backward returns.
//
// Apply it after tensor and expert parallelism. Each gradient is summed over the dims of
// `mesh` that replicate its parameter: with experts over ep, DDP over (dp, ep) sums the
// other parameters over every data-parallel rank in one bucketed all-reduce and the
// experts, sharded over ep, over dp.
// Keep the object alive while training: its hooks stop when it is gone.
#pragma once

#include <memory>

#include "hp/comm/device_mesh.h"
#include "hp/nn/module.h"

namespace hp {

struct DDPOptions {
  double bucket_cap_mb = 25;
  // The first bucket (the last parameters, whose gradients backward produces first) is
  // capped lower, as PyTorch's DDP does (1 MiB), so that communication starts early in
  // backward rather than after a whole bucket of gradients.
  double first_bucket_cap_mb = 1;
  // Across hosts, buckets are made smaller (down to min_bucket_mb) until the gradients
  // fill at least this many: the last bucket cannot start before backward ends, so with a
  // model of a few bucket caps most of its transfer would wait for the end. Inside a host
  // the all-reduce is the cores' own work and each call a synchronisation of every rank:
  // fewer, larger calls are faster there. 0 or 1: caps only.
  int min_buckets = 8;
  // The smallest bucket min_buckets makes: about 2 ms at 1 Gbit/s, against one round trip
  // per call.
  double min_bucket_mb = 0.25;
  // At construction, every replica takes the parameters of the group's rank 0 (as
  // PyTorch's DDP `init_sync`), so replicas initialised differently still train as one.
  bool init_sync = true;
};

namespace parallel {
struct DDPState;
}

class DistributedDataParallel {
 public:
  DistributedDataParallel(nn::Module& module, const DeviceMesh& mesh, DDPOptions options = {});
  // Off: gradients accumulate locally (partial sums) and nothing is communicated; the next
  // backward with it on reduces everything accumulated.
  void set_requires_gradient_sync(bool on);
  int num_buckets() const;

 private:
  std::shared_ptr<parallel::DDPState> state_;
};

}  // namespace hp
