// The degrees of a training layout, in one place: what the planner emits (from_strategy),
// the config's [mesh] declares (from_mesh), and the trainer and the dry-run build their
// meshes from (mesh_shape / mesh_names, the same on every rank). The dim names "pp", "dp",
// "ep", "cp" and "tp" are known here. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/plan/strategy.h"

namespace hp::train {

struct ParallelDims {
  int64_t pp = 1;  // pipeline stages
  int64_t dp = 1;  // data-parallel replicas (ddp, fully_shard or replicate over them)
  int64_t ep = 1;  // expert-parallel ranks: experts sharded over them, each its own rows (as dp)
  int64_t cp = 1;  // context-parallel ranks: each holds a share of every sequence
  int64_t tp = 1;  // tensor-parallel ranks inside a stage
  // Hybrid context parallelism: the mesh's cp dim is split into "cp_ring" (cp / cp_ulysses
  // ranks, outer) and "cp_ulysses" (cp_ulysses ranks, inner). 1: one dim "cp".
  int64_t cp_ulysses = 1;
  // Outermost first: how ranks are numbered. pp is always there (size 1 included), dp
  // too unless the config names another dim (a stage's mesh needs one); tp, ep and cp
  // only when a config names them or a strategy has them > 1 (tp: a strategy's always),
  // since every mesh dim, even of size 1, multiplies the layouts that sharding propagation
  // and the redistribution planner search.
  std::vector<std::string> order{"pp", "dp", "tp"};

  // A config's mesh: each name one of pp, dp, ep, cp, tp, at most once, shapes >= 1;
  // throws naming `source` and what is wrong. Dims it leaves out have size 1.
  static ParallelDims from_mesh(const std::vector<int64_t>& shape, const std::vector<std::string>& names,
                                const std::string& source);
  // A resolved strategy's dims in the planner's rank order.
  static ParallelDims from_strategy(const plan::Strategy& s);

  int64_t size(const std::string& name) const;  // of "pp", "dp", "ep", "cp" or "tp"
  int64_t world_size() const { return pp * dp * ep * cp * tp; }
  // The ranks that read different rows of the batch: dp times ep.
  int64_t data_parallel_size() const { return dp * ep; }
  // The mesh the trainer builds: every dim, size-1 ones included (in `order`, cp split as
  // cp_dims() says).
  std::vector<int64_t> mesh_shape() const;
  std::vector<std::string> mesh_names() const;
  // The dims a stage's model lives on: every one but pp.
  std::vector<std::string> stage_dims() const;
  // The mesh dims that shard the sequence, outer first: {"cp"}, or {"cp_ring", "cp_ulysses"}.
  std::vector<std::string> cp_dims() const;
  // For a config's [mesh]: the dims larger than 1 (dp alone when there is none).
  std::vector<int64_t> config_shape() const;
  std::vector<std::string> config_names() const;
};

}  // namespace hp::train
