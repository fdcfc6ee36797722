// Cost of the precision monitor on a config's run (default configs/demo.toml):
//   hprun --nproc-per-node N bench_monitor [CONFIG] [ROUNDS] [EVERY]
// Each rank builds the model twice, one bare and one watched by the monitor (norms and the
// non-finite check every EVERY steps, default 10, the replica check as often, spikes, a
// file), and alternates blocks of EVERY steps between them (each first in turn), so both
// see the same machine. Every step is timed alone (the slowest rank's). A step's time is
// noisy where other jobs share the cores, so the figures are medians: of every bare step,
// and of the watched steps at each position in the block (the monitored step, the one with
// the replica check, the plain ones). RESULT monitor_overhead is the sum of the watched
// medians over EVERY bare medians (1.03 = 3% slower); monitor_overhead_cpu the same of the
// CPU time all ranks spent in a step, which other jobs on the cores disturb far less.
#include <ATen/ATen.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/world.h"
#include "hp/train/corpus.h"
#include "hp/train/data.h"
#include "hp/train/monitor.h"
#include "hp/train/tokenizer.h"
#include "hp/train/train_step.h"

using namespace hp;
using Clock = std::chrono::steady_clock;

namespace {

double cpu_seconds() {  // of this process, all its threads (Gloo's too)
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// One model with its own data and, when its config says so, the monitor.
struct Run {
  train::TrainConfig cfg;
  train::Training t;
  train::DataLoader loader;
  std::optional<train::Monitor> monitor;
  int64_t step = 0;
  std::vector<double> seconds, cpu;  // this rank's, one per step

  Run(train::TrainConfig c, const std::vector<int64_t>& tokens)
      : cfg(std::move(c)),
        t(train::build_training(cfg)),
        loader(tokens, cfg.train.seq, cfg.train.batch, t.data_rank, t.data_size, cfg.train.seed) {
    if (cfg.monitor.enabled()) monitor.emplace(t, cfg, /*append=*/false);
  }

  void steps(int64_t n, const comm::Group& world) {
    for (int64_t i = 0; i < n; ++i, ++step) {
      train::Batch b = loader.next();
      comm::barrier(world);
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      if (monitor) monitor->begin_step(step);
      train::StepOutput out = train::train_step(t, cfg, b.inputs, b.targets, cfg.train.lr, [&] {
        if (monitor) monitor->after_backward();
      });
      const double loss = out.loss.item<double>();
      if (monitor) monitor->end_step(loss, out.grad_norm);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      cpu.push_back(cpu_seconds() - c0);
    }
  }

  // Every step's wall time (the slowest rank's) or CPU time (all ranks').
  std::vector<double> over_ranks(const std::vector<double>& v, ReduceOp op, const comm::Group& world) const {
    at::Tensor s = at::tensor(v, at::kDouble);
    comm::all_reduce_(s, world, op);
    return std::vector<double>(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bare and watched step times (warm-up first, then blocks of `every`): prints the medians;
// returns the watched block's sum of medians over `every` bare medians.
double report(const char* what, const std::vector<double>& bare, const std::vector<double>& watched, int64_t every) {
  const double base = median(std::vector<double>(bare.begin() + every, bare.end()));
  std::printf("%s: bare step median %.2f ms over %zu steps; watched, at each position of a block:\n", what,
              1e3 * base, bare.size() - every);
  double block = 0;
  for (int64_t k = 0; k < every; ++k) {
    std::vector<double> at_k;
    for (size_t s = every + k; s < watched.size(); s += every) at_k.push_back(watched[s]);
    const double m = median(at_k);
    block += m;
    std::printf("  %2lld %-26s %.2f ms (%+.1f%%)\n", static_cast<long long>(k),
                k == 0 ? "(norms, non-finite check)" : k == every - 1 ? "(replica check)" : "", 1e3 * m,
                100 * (m / base - 1));
  }
  return block / (every * base);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string path = argc > 1 ? argv[1] : "configs/demo.toml";
    const int rounds = argc > 2 ? std::stoi(argv[2]) : 20;
    const int64_t every = argc > 3 ? std::stoll(argv[3]) : 10;
    auto world = comm::init_distributed();
    const train::TrainConfig bare = train::load_config(path);
    HP_CHECK(world->size() == bare.world_size()) << path << " needs " << bare.world_size() << " ranks";
    train::TrainConfig watched = bare;
    const std::string file = "/tmp/bench_monitor_" + std::to_string(::getpid()) + ".jsonl";
    watched.monitor.every = every, watched.monitor.replica_check_every = every;
    watched.monitor.spike_factor = 3, watched.monitor.file = file;

    const std::vector<int64_t> tokens = train::encode(train::read_text(bare.data.path));
    Run a(bare, tokens), b(watched, tokens);
    auto group = world->world_group();
    a.steps(every, *group), b.steps(every, *group);  // warm-up, left out below
    for (int r = 0; r < rounds; ++r) {
      Run& first = r % 2 ? b : a;
      Run& second = r % 2 ? a : b;
      first.steps(every, *group), second.steps(every, *group);
    }
    const auto wall_a = a.over_ranks(a.seconds, ReduceOp::Max, *group);
    const auto wall_b = b.over_ranks(b.seconds, ReduceOp::Max, *group);
    const auto cpu_a = a.over_ranks(a.cpu, ReduceOp::Sum, *group), cpu_b = b.over_ranks(b.cpu, ReduceOp::Sum, *group);
    if (world->rank() != 0) return 0;
    std::remove(file.c_str());
    const double wall = report("wall time", wall_a, wall_b, every), cpu = report("CPU time", cpu_a, cpu_b, every);
    std::printf("RESULT monitor_overhead %.3f\nRESULT monitor_overhead_cpu %.3f\n", wall, cpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_monitor: %s\n", e.what());
    return 1;
  }
  return 0;
}
