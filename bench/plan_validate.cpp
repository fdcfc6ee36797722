// Checks the planner's estimator against real training on this machine.
//
//   hprun --nproc-per-node N bench_plan_validate calibrate > CLUSTER.toml
//     measures this machine's N ranks as a cluster description for the estimator.
//   hprun --nproc-per-node N bench_plan_validate run STRATEGY CLUSTER.toml [CONFIG] [STEPS]
//     trains CONFIG's model (default configs/bench_3m.toml) with STRATEGY ("dp=2,tp=2,zero=3";
//     tp uses sequence parallelism, dp our DDP or fully_shard at the ZeRO stage; pp with
//     2·pp microbatches unless mb says), then rank 0 prints one JSON
//     line: the measured peak of CPU tensor memory (the worst rank) and median step time,
//     and the estimator's memory and step time for the same strategy on CLUSTER.
//   bench_plan_validate summary FILE
//     reads those lines; prints the memory error of each and, per device count, Spearman's
//     rank correlation of estimated against measured step times.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/world.h"
#include "hp/plan.h"
#include "hp/plan/rank_correlation.h"
#include "hp/tensor/memory_stats.h"
#include "hp/train/plan_bridge.h"
#include "hp/train/trainer.h"

using namespace hp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  HP_CHECK(!v.empty()) << "no samples";
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of `reps` rounds of a 1024 x 256 x 256 matmul (a projection of this model's
// size), each followed by an all-gather of `bytes` in all when bytes > 0; median of 5, the
// slowest rank's.
double timed_rounds(const comm::Group& world, int64_t bytes, int reps) {
  at::Tensor a = at::randn({1024, 256}), b = at::randn({256, 256}), c = at::empty({1024, 256});
  at::Tensor piece = at::ones({std::max<int64_t>(1, bytes / 4 / world.size())});
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    comm::barrier(world);
    auto t = Clock::now();
    for (int i = 0; i < reps; ++i) {
      at::mm_out(c, a, b);
      if (bytes > 0) comm::all_gather(piece, world);
    }
    runs.push_back(seconds_since(t));
  }
  at::Tensor m = at::full({1}, median(runs), at::kDouble);
  comm::all_reduce_(m, world, ReduceOp::Max);
  return m.item<double>();
}

// A one-level cluster of this machine's ranks, measured as training uses it: the matmul
// rate while every rank multiplies at once (they share the cores), and what an all-gather
// adds to a step between matmuls (the copies take cores from compute, and every collective
// waits for the slowest rank), at two sizes: latency and bandwidth of a ring follow.
std::string measure_cluster(const comm::Group& world) {
  const int n = world.size(), reps = 40;
  timed_rounds(world, 0, 2);  // warm up
  const double alone = timed_rounds(world, 0, reps);
  const double tflops = 2.0 * 1024 * 256 * 256 * reps / alone / 1e12;
  double bw = 20, lat = 1;
  if (n > 1) {
    const double small_bytes = 4096, big_bytes = 8 << 20;
    const double small = std::max(1e-7, (timed_rounds(world, small_bytes, reps) - alone) / reps);
    const double big = std::max(small + 1e-7, (timed_rounds(world, big_bytes, reps) - alone) / reps);
    lat = small / (n - 1) * 1e6;
    bw = double(n - 1) / n * (big_bytes - small_bytes) / (big - small) / 1e9;
  }
  std::ostringstream toml;
  toml << "name = \"this-machine-" << n << "\"\n[device]\nmemory_GiB = 24\ntflops = " << tflops
       << "\n[[levels]]\nname = \"host\"\nfanout = " << n << "\nbandwidth_GBps = " << bw << "\nlatency_us = " << lat
       << "\n";
  return toml.str();
}

int calibrate() {
  auto world = comm::init_distributed();
  const std::string toml = measure_cluster(*world->world_group());
  if (world->rank() == 0) std::printf("%s", toml.c_str());
  return 0;
}

int run(const std::string& strategy_text, const std::string& cluster_path, const std::string& config_path,
        int steps) {
  track_cpu_memory();
  auto world_ptr = comm::init_distributed();
  comm::Group& world = *world_ptr->world_group();
  train::TrainConfig cfg = train::load_config(config_path);
  plan::ModelDesc model = train::model_desc_of(cfg);
  plan::Strategy s = plan::parse_strategy(strategy_text);
  s.global_batch = cfg.train.batch;
  // The trainer accumulates over microbatches only in a pipeline (2 per stage by default).
  if (s.pp == 1) s.microbatches = 1;
  if (s.microbatches == 0) s.microbatches = 2 * s.pp;
  s = plan::resolve_strategy(s, model, world.size());
  train::apply_strategy(cfg, s);
  cfg.train.steps = steps;
  cfg.train.log_every = 1;
  cfg.checkpoint = {};

  const plan::ClusterSpec cluster = plan::load_cluster(cluster_path);
  reset_cpu_memory_peak();
  std::vector<double> ms;
  train::run_training(cfg, [&](const train::StepLog& l) {
    if (l.step >= 1) ms.push_back(l.ms_per_step);  // the first step warms caches and allocates state
  });
  at::Tensor peak = at::full({1}, double(cpu_memory_peak()), at::kDouble);
  at::Tensor step = at::full({1}, median(ms), at::kDouble);
  comm::all_reduce_(peak, world, ReduceOp::Max);
  comm::all_reduce_(step, world, ReduceOp::Max);

  if (world.rank() == 0) {
    plan::EstimatorOptions o;
    o.numerics = plan::numerics_preset("fp32-eager");
    o.overlap_communication = false;  // the copies run on the cores that compute
    plan::Estimator est(model, cluster, o);
    plan::Estimate e = est.estimate(s);
    const plan::MemoryBreakdown& mem = e.memory;
    nlohmann::json j = {
        {"strategy", strategy_text},
        {"resolved", plan::to_string(s)},
        {"ranks", world.size()},
        {"measured_peak_MiB", peak.item<double>() / (1 << 20)},
        {"estimated_MiB", mem.total() / (1 << 20)},
        {"estimated_parts_MiB",
         {{"params", mem.params / (1 << 20)},
          {"grads", mem.grads / (1 << 20)},
          {"optimizer", mem.optimizer / (1 << 20)},
          {"activations", mem.activations / (1 << 20)},
          {"logits", mem.logits / (1 << 20)},
          {"buffers", mem.zero_buffers / (1 << 20)},
          {"stage_inputs", mem.stage_inputs / (1 << 20)}}},
        {"measured_ms", step.item<double>()},
        {"estimated_ms", e.time.total * 1e3},
        {"cluster",
         {{"tflops", cluster.device.tflops},
          {"GBps", cluster.topology.levels()[0].bandwidth_GBps},
          {"latency_us", cluster.topology.levels()[0].latency_us}}}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// One strategy's runs: medians over the repeats (runs take turns, so drift hits all alike).
struct Row {
  std::string strategy;
  std::vector<double> measured_ms, estimated_ms, measured_mib, estimated_mib;
};

int summary(const std::string& path) {
  std::ifstream in(path);
  HP_CHECK(in.good()) << "bench_plan_validate: cannot read " << path;
  std::map<int, std::vector<Row>> by_ranks;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.front() != '{') continue;
    auto j = nlohmann::json::parse(line);
    auto& rows = by_ranks[j["ranks"].get<int>()];
    const std::string strategy = j["strategy"];
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.strategy == strategy; });
    if (it == rows.end()) it = rows.insert(rows.end(), Row{strategy, {}, {}, {}, {}});
    it->measured_ms.push_back(j["measured_ms"]);
    it->estimated_ms.push_back(j["estimated_ms"]);
    it->measured_mib.push_back(j["measured_peak_MiB"]);
    it->estimated_mib.push_back(j["estimated_MiB"]);
  }
  HP_CHECK(!by_ranks.empty()) << "bench_plan_validate: no results in " << path;
  double worst = 0;
  std::printf("| ranks | strategy | runs | measured peak MiB | estimated MiB | error | measured ms | estimated ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (auto& [ranks, rows] : by_ranks)
    for (auto& r : rows) {
      const double meas = median(r.measured_mib), est = median(r.estimated_mib);
      const double err = (est - meas) / meas;
      worst = std::max(worst, std::abs(err));
      std::printf("| %d | %s | %zu | %.1f | %.1f | %+.1f%% | %.1f | %.1f |\n", ranks, r.strategy.c_str(),
                  r.measured_ms.size(), meas, est, 100 * err, median(r.measured_ms), median(r.estimated_ms));
    }
  std::printf("\nworst memory error: %.1f%%\n", 100 * worst);
  for (auto& [ranks, rows] : by_ranks) {
    if (rows.size() < 3) continue;
    std::vector<double> meas, est;
    for (auto& r : rows) {
      meas.push_back(median(r.measured_ms));
      est.push_back(median(r.estimated_ms));
    }
    std::printf("%d ranks: Spearman rank correlation of step times over %zu strategies: %.2f\n", ranks, rows.size(),
                plan::spearman(meas, est));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "calibrate") return calibrate();
    if (mode == "run" && argc > 3)
      return run(argv[2], argv[3], argc > 4 ? argv[4] : "configs/bench_3m.toml", argc > 5 ? std::atoi(argv[5]) : 6);
    if (mode == "summary" && argc > 2) return summary(argv[2]);
    std::fprintf(stderr,
                 "usage: hprun --nproc-per-node N bench_plan_validate calibrate > CLUSTER.toml\n"
                 "       hprun --nproc-per-node N bench_plan_validate run STRATEGY CLUSTER.toml [CONFIG] [STEPS]\n"
                 "       bench_plan_validate summary FILE\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_plan_validate: %s\n", e.what());
    return 1;
  }
}
