// Sequence-parallel tensor parallelism with the collectives whole against async_tp (each
// all-gather and reduce-scatter split into per-rank pieces that travel while other pieces
// multiply): training step time of the 3M Llama over every rank of the job as one tp dim.
// The two take turns, a fresh model each round, so that drift hits both alike. Last, the
// bytes a rank sends in one step, counted from the collective log as a ring moves them.
//   build/bin/hprun --nproc-per-node 2 build/bin/bench_async_tp [steps] [rounds]
// Where the transfer needs no core (two emulated hosts, 1 Gbit/s):
//   scripts/emulate_hosts --hosts 2 --rate 1gbit -- build/bin/hprun --nnodes 2 --nproc-per-node 1 \
//     build/bin/bench_async_tp 6 3
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "hp/comm/collective_log.h"
#include "hp/comm/trace.h"
#include "hp/optim/adamw.h"
#include "hp/parallel.h"

using namespace hp;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 6;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  HP_CHECK(steps > 0 && rounds > 0) << "bench_async_tp: steps and rounds must be > 0";
  comm::init_distributed();
  const int64_t world = comm::current_world()->size();
  HP_CHECK(world > 1) << "bench_async_tp: needs 2 ranks or more (one tp dim over all of them)";
  DeviceMesh mesh = init_device_mesh("cpu", {1, world}, {"dp", "tp"});
  nn::LlamaConfig c;
  c.vocab = 256, c.dim = 256, c.layers = 4, c.heads = 8, c.kv_heads = 4, c.ffn_dim = 688, c.max_seq = 128;
  const int64_t batch = 4, seq = 128;

  const std::vector<std::string> modes{"sync", "async_tp"};
  std::map<std::string, std::vector<double>> ms;
  std::map<std::string, double> sent_mib;  // of the last step
  // Bytes one rank sends for a collective of `r.numel` input elements over n ranks, as a
  // ring moves them; a point-to-point send moves its tensor.
  auto ring_bytes = [](const comm::CollectiveRecord& r) {
    const double n = double(r.ranks.size()), b = double(r.bytes());
    if (r.op == "all_gather") return b * (n - 1);
    if (r.op == "reduce_scatter") return b * (n - 1) / n;
    if (r.op == "all_reduce") return 2 * b * (n - 1) / n;
    if (r.op == "send") return b;
    return 0.0;
  };
  for (int round = 0; round < rounds; ++round)
    for (const std::string& mode : modes) {
      manual_seed(7);
      nn::Llama model(c, mesh);
      LlamaParallelOptions o;
      o.sequence_parallel = true;
      o.async_tp = mode == "async_tp";
      parallelize_llama(model, mesh["tp"], o);
      optim::AdamW opt(model.parameters());
      for (int step = 0; step < steps + 1; ++step) {
        at::Tensor tokens = (hp::rand({batch, seq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
        std::vector<Placement> rep{Replicate(), Replicate()};
        DTensor ids = distribute_tensor(tokens.narrow(1, 0, seq).contiguous(), mesh, rep);
        DTensor targets = distribute_tensor(tokens.narrow(1, 1, seq).contiguous(), mesh, rep);
        comm::barrier(mesh.group(1));
        comm::CollectiveLog& log = comm::current_world()->collective_log();
        log.clear();
        log.enable(step == steps);
        auto t0 = std::chrono::steady_clock::now();
        {
          trace::Span span("compute", trace::enabled() ? mode + " step" : std::string());
          model.loss(ids, targets).to_local().backward();
        }
        opt.step();
        opt.zero_grad();
        if (step >= 1)
          ms[mode].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        if (log.enabled()) {
          double bytes = 0;
          for (const auto& r : log.records()) bytes += ring_bytes(r);
          sent_mib[mode] = bytes / (1 << 20);
          log.enable(false);
        }
      }
    }

  if (mesh.rank() != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("tp = %lld (sequence parallel), %d rounds x %d steps, batch %lld x seq %lld, Llama dim %lld "
              "layers %lld\n",
              (long long)world, rounds, steps, (long long)batch, (long long)seq, (long long)c.dim,
              (long long)c.layers);
  for (const std::string& mode : modes)
    std::printf("%-10s %10.1f ms/step (median), %.2f MiB sent per rank per step\n", mode.c_str(), median(ms[mode]),
                sent_mib[mode]);
  std::printf("RESULT tp_sp_step_ms %.2f\n", median(ms["sync"]));
  std::printf("RESULT async_tp_step_ms %.2f\n", median(ms["async_tp"]));
  std::printf("RESULT async_tp_over_sync %.3f\n", median(ms["async_tp"]) / median(ms["sync"]));
  std::printf("RESULT tp_sp_sent_mib %.3f\n", sent_mib["sync"]);
  std::printf("RESULT async_tp_sent_mib %.3f\n", sent_mib["async_tp"]);
  return 0;
}
