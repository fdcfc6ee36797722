// Measured step time of every schedule kind against the schedule simulator's
// prediction, and the measured idle fraction per rank.
//
// Ranks are threads of this process (run_local_ranks, real Gloo over loopback),
// each with one intra-op thread. The model is an MLP of 8 Linear+tanh blocks
// (float32), split evenly over the schedule's stages. The costs F, B, I, W of the first,
// a middle and the last stage are calibrated by timing each alone through the runtime's
// own stage code, then fed to simulate() per stage (the "uniform" column costs every
// stage as a middle one), with two hop latencies measured between two ranks: a gradient's
// and a forward activation's, each sent as the runtime sends it ("p2p ms B/F").
//
//   bench_pipeline [ranks=4] [microbatches=8] [dim=512] [rows per microbatch=128] [device ms=0]
//                  [schedules, comma-separated: default all] [shapes: static (default) | dynamic]
//
// Static shapes, as `hp train` runs its pipelines: every activation's receive is posted
// when the step starts. Dynamic: a header with the shape goes first, and the data's receive
// is posted once the header has landed and the rank gets to it.
//
// With fewer cores than ranks the ranks share cores and the measured times exceed
// the prediction by up to ranks/cores: the table prints the core count; "/cores" is
// measured over the simulator's prediction with the ranks sharing this machine's cores
// (CostModel::cores, each stage's host share timed alone, without the emulated device's
// waits); "/loaded" the same with the costs timed alone while every other core runs the
// same calibration (a CPU's clock drops when all its cores work, as they do in the steps);
// and a last prediction from the unit costs as measured inside the steps (same
// contention) isolates the cost of the runtime and the transfers.
//
// device ms > 0 emulates a device per rank: each block still does its (small) arithmetic,
// and its forward, input-gradient and weight-gradient parts each also wait that many ms
// without using a core, as a host thread waits on its accelerator's kernels. The ranks
// then compete for cores only with their arithmetic, so the table measures what the
// schedule and the runtime (dependencies, transfers, bookkeeping) make of fixed unit
// costs, as long as that arithmetic is small: the "arith" column gives its share of a
// stage's F + B (a few percent at dim 128, about a sixth at 512 on a quiet 2-core
// machine). With more ranks than cores a large share is no longer fixed: ranks whose
// arithmetic coincides slow each other. Such delays, and late wake-ups on a loaded
// machine, cost most in the schedules that leave no rank idle (zbv, dualpipev), where
// nearly every path is critical; compare the in-step column with the one timed alone.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm.h"
#include "hp/pipeline.h"
#include "hp/pipeline/wire.h"
#include "hp/schedule.h"
#include "hp/tensor/weight_outputs.h"

using namespace hp;

namespace {

constexpr int kBlocks = 8;

struct Config {
  int ranks = 4, microbatches = 8, dim = 512, rows = 128;
  double device_ms = 0;  // > 0: emulated device time per block and phase
  bool static_shapes = true;
};

void wait_device(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

// Identity whose forward waits `fwd` ms and whose backward waits `bwd` ms. On the
// activation path it stands for a block's forward and input-gradient kernels; on a
// weight (fwd 0) for its weight-gradient kernel, which autograd runs only when the
// weight's gradient is asked for (B and W, not I).
struct DeviceWait : torch::autograd::Function<DeviceWait> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double fwd, double bwd) {
    ctx->saved_data["bwd"] = bwd;
    wait_device(fwd);
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    wait_device(ctx->saved_data["bwd"].toDouble());
    return {g[0], at::Tensor(), at::Tensor()};
  }
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Stage `s` of `num_stages` with `blocks` Linear+tanh blocks.
pipeline::PipelineStage make_stage(const Config& c, int s, int num_stages, int blocks,
                                   std::shared_ptr<const comm::Group> group) {
  pipeline::PipelineStage st;
  st.stage_index = s;
  st.num_stages = num_stages;
  for (int k = 0; k < blocks; ++k) {
    st.parameters.push_back((at::randn({c.dim, c.dim}) / std::sqrt(double(c.dim))).requires_grad_(true));
    st.parameters.push_back(at::zeros({c.dim}).requires_grad_(true));
  }
  st.forward = [p = st.parameters, ms = c.device_ms](const at::Tensor& x) {
    at::Tensor y = x;
    for (size_t i = 0; i < p.size(); i += 2) {
      at::Tensor z;
      if (ms > 0) {
        y = DeviceWait::apply(y, ms, ms);
        z = at::linear(y, DeviceWait::apply(p[i], 0.0, ms), p[i + 1]);
      } else {
        z = at::linear(y, p[i], p[i + 1]);
      }
      WeightOutputRecorder::record(z, {p[i], p[i + 1]});  // a split backward's W starts here
      y = at::tanh(z);
    }
    return y;
  };
  st.loss = [](const at::Tensor& out, const at::Tensor& t) { return (out - t).pow(2).mean(); };
  st.group = std::move(group);
  return st;
}

// Median seconds of the timed part of `fn` (it returns the seconds it timed).
template <typename Fn>
double median_time(int reps, Fn fn) {
  fn();  // warm-up: allocator
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(fn());
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

// F, B, I, W of stage `s` of 3 (0: the first, no input gradient; 1: a middle one; 2: the
// last, with the loss), `blocks` blocks, each phase timed alone.
schedule::StageCost calibrate(const Config& c, int s, int blocks, std::shared_ptr<const comm::Group> g) {
  auto st = make_stage(c, s, 3, blocks, g);
  at::Tensor x = at::randn({c.rows, c.dim}), gy = at::ones({c.rows, c.dim}), target = at::randn({c.rows, c.dim});
  auto fwd = [&](bool split = false) {  // split: recorded for I then W, as the runtime does
    auto w = pipeline::detail::run_forward(st, x, st.is_last() ? target : at::Tensor(), 1.0, split);
    if (!st.is_last()) w.grad_output = gy;
    return w;
  };
  const int reps = 15;
  schedule::StageCost cost;
  cost.f = median_time(reps, [&] {
    double t0 = now_s();
    fwd();
    return now_s() - t0;
  });
  cost.b = median_time(reps, [&] {
    auto w = fwd();
    double t0 = now_s();
    pipeline::detail::run_backward(st, w);
    return now_s() - t0;
  });
  cost.i = median_time(reps, [&] {
    auto w = fwd(true);
    double t0 = now_s();
    pipeline::detail::run_backward_input(st, w);
    return now_s() - t0;
  });
  cost.w = median_time(reps, [&] {
    auto w = fwd(true);
    pipeline::detail::run_backward_input(st, w);
    double t0 = now_s();
    pipeline::detail::run_backward_weight(st, w);
    return now_s() - t0;
  });
  return cost;
}

// Every stage's costs from those of the first, a middle and the last stage: the first
// computes no input gradient (the block nearest the input has less to do) and the last
// adds the loss, so they differ from the middle ones.
std::vector<schedule::StageCost> stage_costs(int num_stages, const schedule::StageCost& first,
                                             const schedule::StageCost& middle, const schedule::StageCost& last) {
  std::vector<schedule::StageCost> out(num_stages, middle);
  out.front() = first;
  if (num_stages > 1) out.back() = last;
  return out;
}

struct Row {
  std::string kind;
  int stages = 0;
  schedule::StageCost first, unit, last;       // each timed alone; unit: a middle stage's
  std::vector<schedule::StageCost> per_stage;  // every stage's, fed to the simulator
  std::vector<schedule::StageCost> loaded;     // the same timed with every core busy
  double predicted_loaded = 0;
  double latency = 0, activation_latency = 0;  // measured point to point, fed to the simulator
  double predicted = 0, sim_bubble = 0, measured = 0;
  double predicted_uniform = 0;  // every stage costed as a middle one
  double arithmetic = 0;         // share of a middle stage's F + B that is host arithmetic
  std::vector<double> host_share;  // per stage: the same for every stage, fed to the simulator
  double predicted_on_cores = 0;   // the ranks sharing this machine's cores
  std::vector<double> sim_idle;  // per rank, simulated
  schedule::StageCost in_step;  // unit costs as measured inside the steps (all ranks)
  double predicted_in_step = 0;
  std::vector<double> idle;
};

// One-way time of a message between two ranks (ping-pong, median), called by every rank;
// ranks 0 and 1 measure, the rest wait at the barrier. `activation`: as the runtime sends
// a forward activation of dynamic shape (a shape header whose receive is posted early,
// then the data, whose receive is posted once the header has landed); else as it sends a
// gradient or a static-shape activation (one message, its receive posted early).
double p2p_latency(const Config& c, const comm::Group& g, bool activation) {
  at::Tensor t = at::zeros({c.rows, c.dim});
  double one_way = 0;
  if (g.rank() < 2) {
    const int peer = 1 - g.rank();
    auto send = [&](int tag) {
      for (auto& p : pipeline::detail::send_activation(t, g, peer, 2 * tag, 2 * tag + 1, activation)) p.wait();
    };
    auto recv = [&](int tag) {
      if (activation)
        pipeline::detail::ActivationRecv(g, peer, 2 * tag, 2 * tag + 1).wait();
      else
        comm::recv_async(t, g, peer, 2 * tag + 1).wait();
    };
    one_way = median_time(41, [&] {
      double t0 = now_s();
      if (g.rank() == 0) {
        send(0);
        recv(1);
      } else {
        recv(0);
        send(1);
      }
      return (now_s() - t0) / 2;
    });
  }
  comm::barrier(g);
  return one_way;
}

Row run_kind(const Config& c, const std::string& kind) {
  auto sched = schedule::make_schedule(kind, c.ranks, c.microbatches);
  Row row;
  row.kind = kind;
  row.stages = sched.num_stages;
  row.idle.assign(c.ranks, 0);
  std::vector<double> wall(c.ranks, 0);
  pipeline::PhaseTime f, b, i, w;  // summed over ranks and steps
  std::mutex mu;
  const int steps = 3, blocks = kBlocks / sched.num_stages;
  comm::run_local_ranks(c.ranks, [&](int rank) {
    at::set_num_threads(1);
    auto group = comm::current_world()->world_group();
    if (rank == 0) {
      row.first = calibrate(c, 0, blocks, group);
      row.unit = calibrate(c, 1, blocks, group);
      row.last = calibrate(c, 2, blocks, group);
      // Host arithmetic of the first, a middle and the last stage: each timed alone without
      // the emulated device's waits.
      Config host = c;
      host.device_ms = 0;
      auto share = [&](int s, const schedule::StageCost& with_device) {
        if (c.device_ms == 0) return 1.0;
        const schedule::StageCost a = calibrate(host, s, blocks, group);
        return std::min(1.0, (a.f + a.b) / (with_device.f + with_device.b));
      };
      const double first = share(0, row.first), unit = share(1, row.unit), last = share(2, row.last);
      row.arithmetic = unit;
      row.host_share.assign(sched.num_stages, unit);
      row.host_share.front() = first;
      if (sched.num_stages > 1) row.host_share.back() = last;
    }
    comm::barrier(*group);  // calibration alone on the machine
    // The same costs with every core busy, as in the steps (a CPU's clock drops when all its
    // cores work): ranks 1 .. cores - 1 calibrate the same stages meanwhile, their figures
    // dropped. Each stage is still timed alone, outside the pipeline.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (rank < std::min(c.ranks, cores)) {
      const schedule::StageCost a = calibrate(c, 0, blocks, group), u = calibrate(c, 1, blocks, group),
                                l = calibrate(c, 2, blocks, group);
      if (rank == 0) row.loaded = stage_costs(sched.num_stages, a, u, l);
    }
    comm::barrier(*group);
    const double latency = p2p_latency(c, *group, false),
                 activation_latency = p2p_latency(c, *group, !c.static_shapes);
    if (rank == 0) row.latency = latency, row.activation_latency = activation_latency;
    std::vector<pipeline::PipelineStage> stages;
    for (int s : sched.stages_of(rank)) stages.push_back(make_stage(c, s, sched.num_stages, blocks, group));
    pipeline::PipelineRuntime rt(stages, sched);
    if (c.static_shapes) rt.set_static_shapes([&](int, int) { return at::empty({c.rows, c.dim}); });
    at::Tensor x = at::randn({c.rows * c.microbatches, c.dim}), y = at::randn({c.rows * c.microbatches, c.dim});
    rt.step(x, y);  // warm-up
    double total = 0, busy = 0;
    std::vector<pipeline::StepStats> stats;
    for (int k = 0; k < steps; ++k) {
      comm::barrier(*group);
      rt.step(x, y);
      stats.push_back(rt.last_stats());
      total += rt.last_stats().wall;
      busy += rt.last_stats().compute;
    }
    std::lock_guard<std::mutex> lock(mu);
    wall[rank] = total / steps;
    row.idle[rank] = 1 - busy / total;
    for (const auto& st : stats) {
      for (auto [sum, part] : {std::pair{&f, st.f}, {&b, st.b}, {&i, st.i}, {&w, st.w}}) {
        sum->seconds += part.seconds;
        sum->count += part.count;
      }
    }
  });
  row.measured = *std::max_element(wall.begin(), wall.end());
  row.per_stage = stage_costs(sched.num_stages, row.first, row.unit, row.last);
  schedule::CostModel cm;
  cm.per_stage = row.per_stage;
  cm.latency = row.latency;
  cm.activation_latency = row.activation_latency;
  auto sim = schedule::simulate(sched, cm);
  row.predicted = sim.makespan;
  schedule::CostModel on_cores = cm;
  on_cores.cores = static_cast<int>(std::thread::hardware_concurrency());
  on_cores.host_share = row.host_share;
  row.predicted_on_cores = schedule::simulate(sched, on_cores).makespan;
  on_cores.per_stage = row.loaded;
  row.predicted_loaded = schedule::simulate(sched, on_cores).makespan;
  row.sim_bubble = sim.bubble_ratio;
  for (double busy : sim.busy) row.sim_idle.push_back(1 - busy / sim.makespan);
  cm.per_stage.clear();
  cm.uniform = row.unit;
  row.predicted_uniform = schedule::simulate(sched, cm).makespan;
  row.in_step = {f.mean(), b.mean(), i.mean(), w.mean()};
  cm.uniform = row.in_step;
  row.predicted_in_step = schedule::simulate(sched, cm).makespan;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (argc > 1) c.ranks = std::atoi(argv[1]);
  if (argc > 2) c.microbatches = std::atoi(argv[2]);
  if (argc > 3) c.dim = std::atoi(argv[3]);
  if (argc > 4) c.rows = std::atoi(argv[4]);
  if (argc > 5) c.device_ms = std::atof(argv[5]);
  std::vector<std::string> kinds = schedule::schedule_kinds();
  if (argc > 6 && std::string(argv[6]) != "all") kinds = split(argv[6], ',');
  if (argc > 7) {
    const std::string shapes = argv[7];
    HP_CHECK(shapes == "static" || shapes == "dynamic") << "bench_pipeline: shapes are static or dynamic, not " << shapes;
    c.static_shapes = shapes == "static";
  }
  at::manual_seed(0);
  std::printf("pipeline bench: %d ranks as threads, %d microbatches, MLP %d blocks of %dx%d, %d rows per "
              "microbatch, float32, %u cores, %s shapes\n",
              c.ranks, c.microbatches, kBlocks, c.dim, c.dim, c.rows, std::thread::hardware_concurrency(),
              c.static_shapes ? "static" : "dynamic");
  if (c.device_ms > 0)
    std::printf("emulated devices: every block's forward, input-gradient and weight-gradient parts wait %.2f ms\n",
                c.device_ms);
  std::printf("%-17s %6s %22s %12s %6s %11s %8s %8s %8s %8s %8s %8s %8s %22s %8s  %s\n", "schedule", "stages",
              "alone: unit ms F/B/I/W", "first B/I ms", "arith", "p2p ms B/F", "sim ms", "meas ms", "meas/sim",
              "/cores", "/loaded", "sim idle", "uniform", "in step: unit ms", "sim ms",
              "measured idle per rank (simulated)");
  std::vector<std::string> results;
  for (const auto& kind : kinds) {
    if (kind == "dualpipev" && c.microbatches < 2 * c.ranks) {
      std::printf("%-17s skipped: needs at least %d microbatches\n", kind.c_str(), 2 * c.ranks);
      continue;
    }
    Row r = run_kind(c, kind);
    auto units = [](const schedule::StageCost& u) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f/%.2f/%.2f/%.2f", u.f * 1e3, u.b * 1e3, u.i * 1e3, u.w * 1e3);
      return std::string(buf);
    };
    char first[32];
    std::snprintf(first, sizeof first, "%.2f/%.2f", r.first.b * 1e3, r.first.i * 1e3);
    char p2p[32];
    std::snprintf(p2p, sizeof p2p, "%.2f/%.2f", r.latency * 1e3, r.activation_latency * 1e3);
    std::printf("%-17s %6d %22s %12s %5.0f%% %11s %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f %8.1f %22s %8.1f ",
                r.kind.c_str(), r.stages, units(r.unit).c_str(), first, r.arithmetic * 100, p2p, r.predicted * 1e3,
                r.measured * 1e3, r.measured / r.predicted, r.measured / r.predicted_on_cores,
                r.measured / r.predicted_loaded, r.sim_bubble, r.predicted_uniform * 1e3, units(r.in_step).c_str(),
                r.predicted_in_step * 1e3);
    for (size_t k = 0; k < r.idle.size(); ++k) std::printf(" %.2f (%.2f)", r.idle[k], r.sim_idle[k]);
    std::printf("\n");
    char line[160];
    std::snprintf(line, sizeof line, "RESULT %s_measured_over_simulated %.3f", r.kind.c_str(), r.measured / r.predicted);
    results.push_back(line);
    std::snprintf(line, sizeof line, "RESULT %s_measured_over_simulated_on_cores %.3f", r.kind.c_str(),
                  r.measured / r.predicted_on_cores);
    results.push_back(line);
    std::snprintf(line, sizeof line, "RESULT %s_measured_over_simulated_loaded %.3f", r.kind.c_str(),
                  r.measured / r.predicted_loaded);
    results.push_back(line);
    std::snprintf(line, sizeof line, "RESULT %s_idle_rank0 %.3f", r.kind.c_str(), r.idle[0]);
    results.push_back(line);
    if (r.kind == "zb-h1") {
      std::snprintf(line, sizeof line, "RESULT split_backward_over_full %.3f", (r.unit.i + r.unit.w) / r.unit.b);
      results.push_back(line);
    }
  }
  for (const auto& line : results) std::printf("%s\n", line.c_str());
  return 0;
}
