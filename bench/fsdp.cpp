// The same model and batch on every rank of the job, one run: step time and memory of our
// DDP, of fully_shard (with and without prefetch), and of Muon against AdamW on the sharded
// model; the modes take turns so that drift hits all alike.
//   build/bin/hprun --nproc-per-node 4 build/bin/bench_fsdp [steps] [rounds] [micro-steps] [modes] [shape]
// micro-steps > 1 accumulates gradients over that many batches per optimizer step (no
// communication until the last), as large-batch training does. `modes`: a comma-separated
// subset of the modes below (default all), e.g. "fsdp adamw,fsdp muon". "on-caller" modes
// run the asynchronous collectives on the calling thread (HP_ASYNC_COLLECTIVES=0), so
// nothing overlaps; "ddp adamw no-comm" skips DDP's all-reduce: the compute-only step that
// exposed communication (step time minus it) is measured against; "fsdp muon no-overlap"
// exchanges Muon's matrices once each way around all the work (MuonOptions::overlap off);
// "fsdp muon bf16" runs the Newton-Schulz iteration in bfloat16 (MuonOptions::ns_dtype);
// "ddp adamw caps-only" buckets by the caps alone, as PyTorch's DDP (min_buckets = 1),
// where the default makes buckets smaller across hosts.
// `shape`: sequences per rank x sequence length (default 4x128; 8x256 is the batch of the
// training-speed comparison, bench/peers).
// Last, the bytes one step's all-gathers move with FP8 weights against bf16 parameters
// (gather_bytes.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "hp/base/strings.h"
#include "hp/optim/chained.h"
#include "hp/parallel.h"
#include "hp/tensor/memory_stats.h"
#include "gather_bytes.h"

using namespace hp;

namespace {

struct Result {
  std::vector<double> ms;
  std::vector<double> opt_ms;  // the optimizer step alone
  double state_mib = 0;  // parameters, gradients and optimizer states a rank holds
  double peak_mib = 0;   // every CPU tensor alive at the worst moment of a step
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 8;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const int micro = argc > 3 ? std::atoi(argv[3]) : 1;
  HP_CHECK(steps > 0 && rounds > 0 && micro > 0) << "bench_fsdp: steps, rounds and micro-steps must be > 0";
  track_cpu_memory();
  comm::init_distributed();
  const int64_t world = comm::current_world()->size();
  DeviceMesh mesh = init_device_mesh("cpu", {world}, {"dp"});
  nn::LlamaConfig c;
  int64_t per_rank = 4, seq = 128;
  if (argc > 5) {
    const std::vector<std::string> bs = split(argv[5], 'x');
    HP_CHECK(bs.size() == 2 && std::atoi(bs[0].c_str()) > 0 && std::atoi(bs[1].c_str()) > 0)
        << "bench_fsdp: the shape is sequences-per-rank x sequence length, e.g. 8x256; got '" << argv[5] << "'";
    per_rank = std::atoi(bs[0].c_str()), seq = std::atoi(bs[1].c_str());
  }
  c.vocab = 256, c.dim = 256, c.layers = 4, c.heads = 8, c.kv_heads = 4, c.ffn_dim = 688, c.max_seq = seq;
  const int64_t batch = per_rank * world;

  std::vector<std::string> modes{"ddp adamw",          "ddp adamw on-caller",  "ddp adamw no-comm",
                                 "ddp adamw caps-only", "fsdp adamw",          "fsdp adamw on-caller",
                                 "fsdp adamw no-prefetch", "fsdp muon",        "fsdp muon no-overlap",
                                 "fsdp muon bf16"};
  if (argc > 4) {
    std::vector<std::string> chosen;
    for (const std::string& m : split(argv[4], ','))
      if (!m.empty()) chosen.push_back(m);
    for (const std::string& m : chosen)
      HP_CHECK(std::find(modes.begin(), modes.end(), m) != modes.end())
          << "bench_fsdp: unknown mode '" << m << "'; the modes are " << to_string_list(modes);
    modes = chosen;
  }
  HP_CHECK(!modes.empty()) << "bench_fsdp: no mode chosen";
  std::map<std::string, Result> results;
  for (int round = 0; round < rounds; ++round)
    for (const std::string& mode : modes) {
      manual_seed(7);
      nn::Llama model(c, mesh);
      std::unique_ptr<DistributedDataParallel> ddp;
      std::optional<FSDPModule> fsdp;
      if (mode.rfind("ddp", 0) == 0) {
        DDPOptions o;
        if (mode.find("caps-only") != std::string::npos) o.min_buckets = 1;  // PyTorch's bucketing
        ddp = std::make_unique<DistributedDataParallel>(model, mesh, o);
      } else {
        FullyShardOptions o;
        o.prefetch = mode.find("no-prefetch") == std::string::npos;
        fsdp = fully_shard_llama(model, mesh, o);
      }
      std::unique_ptr<optim::Optimizer> opt;
      if (mode.find("muon") != std::string::npos) {
        optim::MuonOptions muon;
        muon.overlap = mode.find("no-overlap") == std::string::npos;
        if (mode.find("bf16") != std::string::npos) muon.ns_dtype = at::kBFloat16;
        opt = std::make_unique<optim::ChainedOptimizer>(optim::get_hyper_optimizer(model, muon));
      } else {
        opt = std::make_unique<optim::AdamW>(model.parameters());
      }
      std::vector<Placement> rows{Shard(0)};
      Result& r = results[mode];
      const bool on_caller = mode.find("on-caller") != std::string::npos;
      const bool no_comm = mode.find("no-comm") != std::string::npos;
      if (on_caller) ::setenv("HP_ASYNC_COLLECTIVES", "0", 1);
      reset_cpu_memory_peak();
      auto sync_gradients = [&](bool on) {
        if (ddp) ddp->set_requires_gradient_sync(on);
        if (fsdp) fsdp->set_requires_gradient_sync(on);
      };
      for (int step = 0; step < steps + 2; ++step) {
        std::vector<std::pair<DTensor, DTensor>> batches;
        for (int m = 0; m < micro; ++m) {
          at::Tensor tokens = (hp::rand({batch, seq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
          batches.emplace_back(distribute_tensor(tokens.narrow(1, 0, seq).contiguous(), mesh, rows),
                               distribute_tensor(tokens.narrow(1, 1, seq).contiguous(), mesh, rows));
        }
        comm::barrier(mesh.group(0));
        if (step == steps + 1) reset_cpu_memory_peak();
        auto t0 = std::chrono::steady_clock::now();
        for (int m = 0; m < micro; ++m) {
          sync_gradients(m + 1 == micro && !no_comm);
          model.loss(batches[m].first, batches[m].second).to_local().backward();
        }
        auto t1 = std::chrono::steady_clock::now();
        opt->step();
        const double opt_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
        if (step == steps + 1) {  // what a rank holds between backward and zero_grad
          double bytes = 0;
          for (DTensor* p : model.parameters())
            bytes += double(p->to_local().nbytes() + p->to_local().grad().nbytes());
          for (auto& s : opt->state()) bytes += double(s.local->nbytes());
          r.state_mib = bytes / (1 << 20);
          r.peak_mib = double(cpu_memory_peak()) / (1 << 20);
        }
        opt->zero_grad();
        if (step >= 2) {
          r.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          r.opt_ms.push_back(opt_ms);
        }
      }
      if (on_caller) ::unsetenv("HP_ASYNC_COLLECTIVES");
    }

  const GatherBytes gathered = fsdp_gather_bytes(c, mesh, batch, seq);
  if (mesh.rank() != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const auto base = results.count("ddp adamw") ? results["ddp adamw"] : results[modes[0]];
  const double ddp = median(base.ms);
  std::printf("%d ranks, %d rounds x %d steps of %d micro-steps, batch %lld x seq %lld, Llama dim %lld layers %lld (3.0M parameters)\n",
              int(world), rounds, steps, micro, (long long)batch, (long long)seq, (long long)c.dim, (long long)c.layers);
  std::printf("%-24s %10s %10s %12s %16s %16s\n", "mode", "ms/step", "vs first", "optimizer ms", "state MiB/rank",
              "peak MiB/rank");
  for (const std::string& mode : modes) {
    const Result& r = results[mode];
    std::printf("%-24s %10.1f %9.2fx %12.1f %16.2f %16.1f\n", mode.c_str(), median(r.ms), median(r.ms) / ddp,
                median(r.opt_ms), r.state_mib, r.peak_mib);
  }
  auto ratio = [&](const char* a, const char* b) {
    return results.count(a) && results.count(b) ? median(results[a].ms) / median(results[b].ms) : 0.0;
  };
  if (ratio("fsdp adamw", "fsdp adamw no-prefetch") > 0)
    std::printf("prefetch: %.2fx the step time without it\n", ratio("fsdp adamw", "fsdp adamw no-prefetch"));
  auto exposed = [&](const char* a) {
    return results.count(a) && results.count("ddp adamw no-comm")
               ? median(results[a].ms) - median(results["ddp adamw no-comm"].ms)
               : 0.0;
  };
  if (exposed("ddp adamw on-caller") > 0) {
    std::printf("ddp: exposed communication %.1f ms overlapped, %.1f ms on the caller: %.2fx\n",
                exposed("ddp adamw"), exposed("ddp adamw on-caller"),
                exposed("ddp adamw") / exposed("ddp adamw on-caller"));
    std::printf("RESULT ddp_exposed_comm_ratio %.3f\n", exposed("ddp adamw") / exposed("ddp adamw on-caller"));
    if (results.count("ddp adamw caps-only")) {
      const double caps = exposed("ddp adamw caps-only") / exposed("ddp adamw on-caller");
      std::printf("ddp with the caps' buckets only: exposed communication %.1f ms: %.2fx\n",
                  exposed("ddp adamw caps-only"), caps);
      std::printf("RESULT ddp_caps_only_exposed_comm_ratio %.3f\n", caps);
    }
  }
  // fully_shard computes what DDP does (and copies its shards in and out, which counts
  // here as communication on both sides).
  if (exposed("fsdp adamw on-caller") > 0) {
    std::printf("fsdp: exposed communication %.1f ms overlapped, %.1f ms on the caller: %.2fx\n",
                exposed("fsdp adamw"), exposed("fsdp adamw on-caller"),
                exposed("fsdp adamw") / exposed("fsdp adamw on-caller"));
    std::printf("RESULT fsdp_exposed_comm_ratio %.3f\n", exposed("fsdp adamw") / exposed("fsdp adamw on-caller"));
  }
  if (ratio("ddp adamw", "ddp adamw on-caller") > 0)
    std::printf("RESULT ddp_step_overlapped_vs_on_caller %.3f\n", ratio("ddp adamw", "ddp adamw on-caller"));
  if (ratio("fsdp adamw", "fsdp adamw on-caller") > 0)
    std::printf("RESULT fsdp_step_overlapped_vs_on_caller %.3f\n", ratio("fsdp adamw", "fsdp adamw on-caller"));
  if (ratio("fsdp muon", "fsdp adamw") > 0) {
    // The bound at equal flop rates: Newton-Schulz's 5 x (4 n^2 m + 2 n^3) flops per matrix
    // (n x m its wide form), shared evenly by the ranks, against the 6 flops per parameter
    // and token of each rank's forward and backward.
    manual_seed(7);
    nn::Llama model(c, mesh);
    double ns = 0, params = 0;
    for (auto& [name, p] : model.named_parameters()) {
      params += double(p->spec().numel());
      if (name.rfind("layers.", 0) != 0 || p->dim() != 2) continue;
      const double n = double(std::min(p->size(0), p->size(1))), m = double(std::max(p->size(0), p->size(1)));
      ns += 5 * (4 * n * n * m + 2 * n * n * n);
    }
    const double tokens = double(batch / world) * seq * micro;
    const double bound = 1 + ns / double(world) / (6 * params * tokens);
    std::printf("muon: %.2fx adamw's step time (fully_shard); bound at equal flop rates %.3fx (%.0f tokens per rank per step)\n",
                ratio("fsdp muon", "fsdp adamw"), bound, tokens);
    std::printf("RESULT muon_over_adamw %.3f\n", ratio("fsdp muon", "fsdp adamw"));
    std::printf("RESULT muon_flop_bound %.3f\n", bound);
  }
  if (ratio("fsdp muon bf16", "fsdp adamw") > 0) {
    std::printf("muon, Newton-Schulz in bfloat16: %.2fx adamw's step time\n", ratio("fsdp muon bf16", "fsdp adamw"));
    std::printf("RESULT muon_bf16_over_adamw %.3f\n", ratio("fsdp muon bf16", "fsdp adamw"));
  }
  if (ratio("fsdp muon", "fsdp muon no-overlap") > 0) {
    const double opt = median(results["fsdp muon"].opt_ms), one = median(results["fsdp muon no-overlap"].opt_ms);
    std::printf("muon: optimizer step %.1f ms with its exchanges overlapped, %.1f ms with one exchange each way: %.2fx\n",
                opt, one, opt / one);
    std::printf("RESULT muon_optimizer_overlapped_over_one_exchange %.3f\n", opt / one);
  }
  if (ratio("fsdp adamw", "fsdp adamw no-prefetch") > 0)
    std::printf("RESULT fsdp_prefetch_ratio %.3f\n", ratio("fsdp adamw", "fsdp adamw no-prefetch"));
  std::printf("all-gather bytes of one step per rank: FP8 weights %lld, bf16 %lld\n", (long long)gathered.fp8,
              (long long)gathered.bf16);
  std::printf("RESULT fp8_all_gather_bytes_ratio %.4f\n", gathered.ratio());
  return 0;
}
