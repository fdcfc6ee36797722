// Cost of the precision monitor on a config's run (default configs/demo.toml):
//   hprun --nproc-per-node N bench_monitor [CONFIG] [ROUNDS] [EVERY]
// One model, watched by the monitor (norms and the non-finite check every EVERY steps,
// default 10, the replica check as often, spikes, a file), trains in blocks of EVERY steps
// that alternate between bare (the monitor is not called: its hooks stay unarmed) and
// watched (each first in turn), so both see the same machine and the same model. A second
// model would not do: the one built second runs several percent slower here whatever it
// holds. Every step is timed alone (the slowest rank's); where other jobs share the cores a
// step's time is noisy, so the figures are medians: of the bare steps, of the watched
// plain steps, and of the watched steps with the norms (first of a block) and with the
// replica check (last). RESULT monitor_overhead is a watched block's time over a bare one's
// (1.03 = 3% slower), from the extra time of those two steps; monitor_overhead_cpu the same
// of the CPU time all ranks spent in a step.
#include <ATen/ATen.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

struct Times {
  std::vector<double> wall, cpu;  // this rank's, one per step
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every step's wall time (the slowest rank's, op = Max) or CPU time (all ranks', Sum).
std::vector<double> over_ranks(const std::vector<double>& v, ReduceOp op, const comm::Group& world) {
  at::Tensor s = at::tensor(v, at::kDouble);
  comm::all_reduce_(s, world, op);
  return std::vector<double>(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
}

// Prints the medians of bare steps, of watched plain steps, and of the watched steps with
// the norms (position 0 of a block) and the replica check (position every - 1); returns a
// watched block's time over a bare block's, the two costly steps' extra time over `every`
// plain ones. The plain watched steps differ from the bare ones by inert hook calls only:
// their difference is printed as a check (it is within the noise), not added in.
double report(const char* what, const std::vector<double>& bare, const std::vector<double>& watched, int64_t every) {
  const double base = median(bare);
  std::vector<double> plain, norms, replicas;
  for (size_t s = 0; s < watched.size(); ++s) {
    const int64_t k = static_cast<int64_t>(s) % every;
    (k == 0 ? norms : k == every - 1 ? replicas : plain).push_back(watched[s]);
  }
  const double p = median(plain), n = median(norms), r = median(replicas);
  std::printf("%s, medians: bare step %.2f ms (%zu); watched: plain step %+.1f%% (%zu), with the norms %+.2f ms, "
              "with the replica check %+.2f ms (%zu each)\n",
              what, 1e3 * base, bare.size(), 100 * (p / base - 1), plain.size(), 1e3 * (n - p), 1e3 * (r - p),
              norms.size());
  return 1 + (n - p + r - p) / (static_cast<double>(every) * p);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string path = argc > 1 ? argv[1] : "configs/demo.toml";
    const int rounds = argc > 2 ? std::stoi(argv[2]) : 20;
    const int64_t every = argc > 3 ? std::stoll(argv[3]) : 10;
    HP_CHECK(every >= 2) << "EVERY must be >= 2: a block needs the norms' step and the replica check's apart";
    auto world = comm::init_distributed();
    train::TrainConfig cfg = train::load_config(path);
    HP_CHECK(world->size() == cfg.world_size()) << path << " needs " << cfg.world_size() << " ranks";
    const std::string file = "/tmp/bench_monitor_" + std::to_string(::getpid()) + ".jsonl";
    cfg.monitor.every = every, cfg.monitor.replica_check_every = every;
    cfg.monitor.spike_factor = 3, cfg.monitor.file = file;

    train::Training t = train::build_training(cfg);
    train::DataLoader loader(train::encode(train::read_text(cfg.data.path)), cfg.train.seq, cfg.train.batch,
                             t.data_rank, t.data_size, cfg.train.seed);
    train::Monitor monitor(t, cfg, /*append=*/false);
    auto group = world->world_group();
    int64_t step = 0;
    // `every` steps from a multiple of `every` on, watched or not; times kept when `into`.
    auto block = [&](bool watched, Times* into) {
      for (int64_t i = 0; i < every; ++i, ++step) {
        train::Batch b = loader.next();
        comm::barrier(*group);
        const auto t0 = Clock::now();
        const double c0 = cpu_seconds();
        if (watched) monitor.begin_step(step);
        train::StepOutput out = train::train_step(t, cfg, b.inputs, b.targets, cfg.train.lr, [&] {
          if (watched) monitor.after_backward();
        });
        const double loss = out.loss.item<double>();
        if (watched) monitor.end_step(loss, out.grad_norm);
        if (!into) continue;
        into->wall.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        into->cpu.push_back(cpu_seconds() - c0);
      }
    };
    block(false, nullptr), block(true, nullptr);  // warm-up
    Times bare, watched;
    for (int r = 0; r < rounds; ++r) {
      block(r % 2 == 1, r % 2 == 1 ? &watched : &bare);
      block(r % 2 == 0, r % 2 == 0 ? &watched : &bare);
    }
    const auto wall_a = over_ranks(bare.wall, ReduceOp::Max, *group);
    const auto wall_b = over_ranks(watched.wall, ReduceOp::Max, *group);
    const auto cpu_a = over_ranks(bare.cpu, ReduceOp::Sum, *group);
    const auto cpu_b = over_ranks(watched.cpu, ReduceOp::Sum, *group);
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
