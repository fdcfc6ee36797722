// Estimates one training step of a model under a strategy on a cluster: per-rank
// memory, communication per collective and link level, and step time.
//
// Step time = m * (slowest stage's per-microbatch time) / (1 - bubble fraction)
//           + exposed pipeline sends + exposed data-parallel communication, where a
// stage's per-microbatch time = compute + tp + ep + exposed cp communication. The bubble
// fraction and each rank's peak of in-flight activations come from simulating the
// strategy's schedule (pipeline_profile.h, which says how the costs map).
// Compute = FLOPs / (device peak * compute_efficiency); FLOPs = 3 forward passes
// (6 * active matmul params per token + causal attention 6 * seq * q_dim per layer),
// one more forward of the layers under full recompute (less the products only the residual
// add reads, which the recompute leaves out: below 4/3), a small share more
// under selective recompute. Which communication hides behind compute:
//   tp all-gather/reduce-scatter, ep all-to-all     exposed
//   cp, by Strategy::cp_mode (cp_traffic.h):
//     ring hops, all-gather of k,v, reduce-scatter  hidden behind attention compute
//     ulysses all-to-all (hybrid's too)             exposed
//   pp send/recv                                     exposed on the fill and drain path only
//   dp gradient all-reduce (ZeRO-0)                  hidden behind the last backward
//   ZeRO-1/2 parameter all-gather, once per step     hidden behind the first forward
//   ZeRO-1 gradient reduce-scatter, once per step    hidden behind the last backward
//   ZeRO-2 reduce-scatter, every microbatch          hidden behind each backward
//   ZeRO-3 all-gathers and reduce-scatter            hidden behind each microbatch's compute
// (dp, zero and cp fully exposed when EstimatorOptions::overlap_communication is false).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hp/plan/cluster_spec.h"
#include "hp/plan/flops.h"
#include "hp/plan/memory.h"
#include "hp/plan/model_desc.h"
#include "hp/plan/pipeline_profile.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/plan/stage_split.h"
#include "hp/plan/strategy.h"

namespace hp::plan {

struct EstimatorOptions {
  double compute_efficiency = 0.55;       // achieved / peak FLOP/s of the matmuls (a guess)
  double usable_memory_fraction = 0.9;    // the rest: allocator slack, runtime, comm buffers (a guess)
  // Extra forward share for replaying norms and activations under the default policy
  // (bench_memory on a CPU at 2e0f4ca: a 20-27 ms replay beside a forward of about 220 ms).
  double selective_recompute_cost = 0.1;
  // Extra forward share of full_chunked over full: the MLP's products in smaller pieces
  // (bench_memory on a CPU: 0.03-0.09 of the step more, 0.1-0.25 of a forward).
  double chunked_recompute_cost = 0.15;
  Numerics numerics;                        // bytes per element, what activations are kept
  // Whether data-parallel and cp communication runs beside compute (devices with copy
  // engines and spare links). false: it costs the step its whole time, as on CPU ranks
  // that share their cores with the copies.
  bool overlap_communication = true;
};

struct CommItem {
  std::string name;          // "tp all_gather", "dp grad all_reduce", ...
  Collective kind;
  std::string group;         // group kind, e.g. "tp" or "dp*ep*cp"
  int64_t group_size = 1;
  double bytes = 0;          // logical buffer per call (see ClusterTopology::cost)
  double calls = 0;          // per step
  double seconds = 0;        // per step, before overlap
  double exposed = 0;        // per step, on the critical path
  std::vector<double> bytes_per_level;  // sent per rank per step, by link level
};

struct TimeBreakdown {
  double compute = 0;    // incl. recompute
  double recompute = 0;  // share of compute
  double tp = 0, cp = 0, ep = 0, pp = 0, dp = 0, zero = 0;  // exposed communication; zero: ZeRO-2/3's per microbatch
  double bubble = 0;
  double total = 0;
};

struct Estimate {
  Strategy strategy;
  MemoryBreakdown memory;  // the pipeline rank with the most memory
  double usable_memory = 0;  // bytes
  bool fits = false;
  std::vector<CommItem> comm;  // for the slowest pipeline rank
  std::vector<double> comm_bytes_per_level;  // per rank per step, all items
  std::vector<std::string> level_names;
  TimeBreakdown time;
  int64_t slowest_stage = 0;
  double bubble_fraction = 0;
  double tokens_per_second = 0;
  double model_flops = 0;  // per step, without recompute
  double mfu = 0;
};

class RankGroups;
class CostCache;

// Reuses rank groups and collective costs while consecutive strategies keep the same
// mesh dims, each chunk count's stage split and each schedule shape's simulation, which
// is what makes a search over many strategies cheap.
class Estimator {
 public:
  Estimator(ModelDesc model, ClusterSpec cluster, EstimatorOptions options = {});
  ~Estimator();

  // `s` must be resolved (resolve_strategy) for this model and some device count.
  MemoryBreakdown memory(const Strategy& s) const;  // the worst pipeline rank
  std::vector<MemoryBreakdown> stage_memories(const Strategy& s) const;  // each pipeline rank's
  Estimate estimate(const Strategy& s);
  double usable_memory() const;

  const ModelDesc& model() const { return model_; }
  const ClusterSpec& cluster() const { return cluster_; }
  const EstimatorOptions& options() const { return options_; }

 private:
  RankGroups& groups_for(const Strategy& s);
  std::vector<StageContents> stages_for(const Strategy& s) const;
  ModelDesc model_;
  ClusterSpec cluster_;
  EstimatorOptions options_;
  std::unique_ptr<CostCache> costs_;
  std::unique_ptr<RankGroups> groups_;
  std::vector<int64_t> groups_dims_;
  mutable std::map<int64_t, StageSplit> splits_;  // by chunk count (pp * virtual stages)
  mutable PipelineProfiles pipelines_;
};

// Resolves `s` for the cluster's devices (or `devices` when > 0) and estimates it.
Estimate estimate(const ModelDesc& m, const ClusterSpec& c, const Strategy& s, int64_t devices = 0,
                  const EstimatorOptions& o = {});

}  // namespace hp::plan
