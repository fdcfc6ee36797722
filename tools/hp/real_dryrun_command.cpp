// `hp dryrun --real`: the trainer's real setup and steps as one rank of a large job, on a
// fake process group and meta tensors, printed beside the estimator's memory.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "hp/base/error.h"
#include "hp/plan.h"
#include "hp/train/dry_run.h"
#include "hp/train/plan_bridge.h"

namespace hp::cli {
namespace {

constexpr double kMiB = 1 << 20;

}  // namespace

void run_real_dryrun(const plan::ModelDesc& m, const plan::ClusterSpec& c, plan::Strategy s, int64_t devices,
                     int rank, int64_t steps, bool json) {
  // Without pipeline stages the trainer runs one microbatch per step.
  HP_CHECK(s.pp > 1 || s.microbatches <= 1) << "dryrun --real: without pp the trainer runs one microbatch per step, "
                                            << "found mb=" << s.microbatches;
  if (s.pp <= 1) s.microbatches = 1;
  s = plan::resolve_strategy(s, m, devices);
  train::TrainConfig cfg = train::config_of(m, s);
  cfg.train.steps = 1;
  cfg.source = "dryrun --real";
  const train::DryRunResult r = train::dry_run(cfg, rank, steps);

  plan::EstimatorOptions o;
  o.numerics = plan::numerics_preset("fp32-eager");  // what hp::nn keeps, in float32
  o.overlap_communication = false;
  plan::Estimator est(m, c, o);
  const plan::MemoryBreakdown mem = est.stage_memories(s).at(cfg.mesh_coordinate("pp", rank));
  // The estimator's token all-to-all per step (MoE with ep > 1), beside the log's.
  double est_a2a = 0;
  for (const plan::CommItem& item : est.estimate(s).comm)
    if (item.kind == Collective::AllToAll) est_a2a += item.bytes * item.calls;
  const auto setup = std::vector<comm::CollectiveRecord>(r.collectives.begin(),
                                                         r.collectives.begin() + r.setup_collectives);
  const auto step = std::vector<comm::CollectiveRecord>(r.collectives.begin() + r.setup_collectives,
                                                        r.collectives.end());
  const auto per_step = comm::summarize(step);

  if (json) {
    auto rows = [&](const std::vector<comm::CollectiveSummary>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& x : v)
        a.push_back({{"op", x.op}, {"group_size", x.group_size}, {"count", x.count}, {"bytes", x.bytes}});
      return a;
    };
    nlohmann::json j = {{"model", m.name},
                        {"strategy", plan::to_string(s)},
                        {"rank", r.rank},
                        {"world", r.world},
                        {"steps", r.steps},
                        {"setup_MiB", r.setup_bytes / kMiB},
                        {"high_water_MiB", r.peak_bytes / kMiB},
                        {"estimated_MiB", mem.total() / kMiB},
                        {"estimated_pipeline_rank", mem.stage},
                        {"estimator_numerics", o.numerics.name},
                        {"collectives_setup", rows(comm::summarize(setup))},
                        {"collectives_steps", rows(per_step)},
                        {"estimated_all_to_all_MiB", est_a2a / kMiB},
                        {"seconds", r.seconds}};
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("real dry-run: %s, %s, rank %d of %lld, %lld step%s on a fake process group and meta tensors\n",
              m.name.c_str(), plan::to_string(s).c_str(), r.rank, static_cast<long long>(r.world),
              static_cast<long long>(r.steps), r.steps == 1 ? "" : "s");
  std::printf("memory (MiB)\n");
  std::printf("  after setup (params, optimizer, buffers)  %12.1f\n", r.setup_bytes / kMiB);
  std::printf("  high-water mark                           %12.1f\n", r.peak_bytes / kMiB);
  std::printf("  estimator (%s), its stage %-4lld     %12.1f   dry-run / estimate %.3f\n", o.numerics.name.c_str(),
              static_cast<long long>(mem.stage), mem.total() / kMiB, mem.total() > 0 ? r.peak_bytes / mem.total() : 0.0);
  std::printf("    parameters %.1f, optimizer %.1f, buffers %.1f; activations %.1f, logits %.1f, stage inputs %.1f "
              "beside gradients %.1f, or gradients %.1f beside activations %.1f\n",
              mem.params / kMiB, mem.optimizer / kMiB, (mem.zero_buffers + mem.ddp_buckets) / kMiB,
              mem.activations / kMiB, mem.logits / kMiB, mem.stage_inputs / kMiB, mem.grads_at_activation_peak / kMiB,
              mem.grads / kMiB, mem.activations_at_gradient_peak / kMiB);
  std::printf("collectives over %lld step%s (setup issued %lld more)\n", static_cast<long long>(r.steps),
              r.steps == 1 ? "" : "s", static_cast<long long>(setup.size()));
  std::printf("  %-16s %10s %8s %14s\n", "op", "group size", "count", "MiB");
  for (const auto& x : per_step)
    std::printf("  %-16s %10d %8lld %14.1f\n", x.op.c_str(), x.group_size, static_cast<long long>(x.count),
                x.bytes / kMiB);
  if (est_a2a > 0) std::printf("  estimator all_to_all %24.1f\n", est_a2a / kMiB);
  std::printf("time %.2f s\n", r.seconds);
}

}  // namespace hp::cli
