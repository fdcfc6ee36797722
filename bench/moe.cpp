// The MoE Llama on every rank of the job at expert-parallel degrees 1, 2, 4 (the rest of
// the ranks data parallel; the same global batch and model at every degree), taking turns
// round by round: tokens/s, the token all-to-alls' share of the step (forward and
// backward, timed inside the dispatcher), and the bytes dispatch + combine send in one
// forward, summed over ranks, against the analytic 2 * T * k * h * 4 per MoE layer (T
// tokens of the global batch): the dispatchers' rows, and every float all-to-all of the
// collective log (the layout changes of other ops add a few).
//
// Chunked rows: at the largest expert-parallel degree the same step with the token
// exchange in C chunks (MoEOptions::num_chunks, default C = 2 and 4), taking turns with
// C = 1; RESULT moe_chunked_speedup_ep<ep>_chunks<C> is tokens/s chunked over unchunked,
// moe_chunked_speedup_bound_ep<ep>_chunks<C> what hiding all but 1/C of the unchunked
// step's exchange wait would gain in the same run (an estimate, not a bound: two chunks
// have passed it, gaining beyond the waits the dispatcher times), and the a2a share of a
// chunked row is the time the step waited on its exchanges. "cores busy" is the share of
// the step the cores this rank may run on were busy (/proc/stat: the rank, its
// communication threads, the kernel moving the bytes); moe_chunked_speedup_core_bound_ep<ep>
// is the unchunked step over that busy time, what chunking could gain before the cores
// ran out.
// The overlap pays where the transfers need no core, across hosts:
//   scripts/emulate_hosts --hosts 2 --rate 1gbit -- build/bin/hprun --nnodes 2 \
//     --node-rank {node_rank} --master-addr {master_addr} --master-port {master_port} --nproc-per-node 1 \
//     build/bin/bench_moe 6 4
//   build/bin/hprun --nproc-per-node 4 build/bin/bench_moe [steps] [rounds] [chunks, e.g. 2,4] [top_k] [width]
// A larger top_k (8: every expert) makes the exchange and the experts a larger share of
// the step, the rest of the model unchanged; a larger expert width (default 96) gives the
// experts more compute per exchanged byte, for the exchange to hide behind.
// DDP over (dp, ep) sums the gradients of the parameters outside the experts over every
// rank in buckets behind the backward, and the experts' over dp, at every degree alike.
#include <ATen/ATen.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "hp/comm/world.h"
#include "hp/optim/adamw.h"
#include "hp/parallel.h"

using namespace hp;

namespace {

struct Result {
  std::vector<double> ms, a2a_share;
  double busy_seconds = 0, timed_seconds = 0;  // of the cores this rank may run on, over the timed steps
  double bytes = 0, token_bytes = 0, analytic = 0;  // every float all-to-all; the dispatchers' rows
};

// The CPUs this process may run on (every one of the machine's if that cannot be read).
cpu_set_t allowed_cpus() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (::sched_getaffinity(0, sizeof mine, &mine) != 0)
    for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c) CPU_SET(c, &mine);
  return mine;
}

// Seconds the cores this process may run on have been busy (anything but idle and iowait:
// this rank, its communication threads, the kernel's network stack), from /proc/stat.
double cores_busy_seconds() {
  const cpu_set_t mine = allowed_cpus();
  std::ifstream stat("/proc/stat");
  double ticks = 0;
  for (std::string line; std::getline(stat, line);) {
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line.substr(3));
    int cpu = 0;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (CPU_ISSET(cpu, &mine)) ticks += user + nice + system + irq + softirq + steal;
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 6;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  HP_CHECK(steps > 0 && rounds > 0) << "bench_moe: steps and rounds must be > 0";
  std::vector<int64_t> chunk_counts;
  {
    std::stringstream list(argc > 3 ? argv[3] : "2,4");
    for (std::string c; std::getline(list, c, ',');) chunk_counts.push_back(std::stoll(c));
  }
  for (int64_t c : chunk_counts) HP_CHECK(c > 1) << "bench_moe: chunk counts must be > 1, got " << c;
  const int64_t top_k = argc > 4 ? std::atoll(argv[4]) : 2;
  const int64_t expert_width = argc > 5 ? std::atoll(argv[5]) : 96;
  HP_CHECK(top_k > 0 && expert_width > 0) << "bench_moe: top_k and width must be > 0";
  comm::init_distributed();
  const int64_t world = comm::current_world()->size();
  nn::MoELlamaConfig c;
  c.llama.vocab = 256, c.llama.dim = 128, c.llama.layers = 4, c.llama.heads = 4, c.llama.kv_heads = 2;
  c.llama.ffn_dim = 384, c.llama.max_seq = 128;
  c.moe.num_experts = 8, c.moe.top_k = top_k, c.moe.aux_loss_coef = 0.01;
  c.moe_hidden_dim = expert_width, c.dense_layers = 1;
  const int64_t batch = 4 * world, seq = 64, tokens = batch * seq;
  const int64_t moe_layers = c.llama.layers - c.dense_layers;

  std::vector<int64_t> degrees;
  for (int64_t ep : {1, 2, 4})
    if (world % ep == 0 && ep <= c.moe.num_experts) degrees.push_back(ep);
  using Variant = std::pair<int64_t, int64_t>;  // ep, chunks
  std::vector<Variant> variants;
  for (int64_t ep : degrees) variants.push_back({ep, 1});
  const int64_t chunked_ep = degrees.back();
  if (chunked_ep > 1)
    for (int64_t chunks : chunk_counts) variants.push_back({chunked_ep, chunks});
  std::map<Variant, Result> results;
  for (int round = 0; round < rounds; ++round)
    for (const auto& [ep, chunks] : variants) {
      DeviceMesh mesh = init_device_mesh("cpu", {world / ep, ep}, {"dp", "ep"});
      manual_seed(7);
      nn::MoELlamaConfig vc = c;
      vc.moe.num_chunks = chunks;
      nn::MoELlama model(vc, mesh);
      if (ep > 1) expert_parallelize_moe_llama(model, mesh["ep"]);
      DistributedDataParallel ddp(model, mesh.submesh({"dp", "ep"}));
      optim::AdamW opt(model.parameters());
      std::vector<AllToAllTokenDispatcher*> dispatchers;
      for (nn::MoE* m : nn::moe_layers(model))
        if (auto* d = dynamic_cast<AllToAllTokenDispatcher*>(&m->token_dispatcher())) dispatchers.push_back(d);
      Result& r = results[{ep, chunks}];
      auto& log = comm::current_world()->collective_log();
      for (int step = 0; step < steps + 2; ++step) {  // two warm-up steps plan the layouts
        at::Tensor t = (hp::rand({batch, seq + 1}, at::kDouble) * c.llama.vocab).floor().to(at::kLong);
        DTensor ids = distribute_tensor(t.narrow(1, 0, seq).contiguous(), mesh, {Shard(0), Shard(0)});
        DTensor tgt = distribute_tensor(t.narrow(1, 1, seq).contiguous(), mesh, {Shard(0), Shard(0)});
        for (auto* d : dispatchers) d->reset_all_to_all_seconds();
        const bool count = step == steps + 1 && round == 0;
        comm::barrier(mesh.whole_group());
        const double busy0 = cores_busy_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        if (count) log.clear(), log.enable();
        DTensor loss = model.loss(ids, tgt);
        if (count) log.enable(false);
        loss.to_local().backward();
        nn::update_expert_bias(model);
        opt.step();
        opt.zero_grad();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double busy = cores_busy_seconds() - busy0;
        if (step < 2) continue;
        r.busy_seconds += busy, r.timed_seconds += s;
        double a2a = 0;
        for (auto* d : dispatchers) a2a += d->all_to_all_seconds();
        r.ms.push_back(1e3 * s);
        r.a2a_share.push_back(a2a / s);
        if (count) {
          double sent = 0;
          for (const auto& rec : log.records())
            if (rec.op == "all_to_all" && rec.dtype == at::kFloat) sent += double(rec.bytes());
          double rows = 0;  // dispatch sends rows_sent, combine sends back rows_received
          for (auto* d : dispatchers) rows += double(d->rows_sent() + d->rows_received());
          at::Tensor total = at::tensor({sent, rows * double(c.llama.dim) * 4}, at::kDouble);
          comm::all_reduce_(total, mesh.whole_group());
          r.bytes = total[0].item<double>();
          r.token_bytes = total[1].item<double>();
          r.analytic = ep > 1 ? 2.0 * double(tokens * c.moe.top_k * c.llama.dim * 4 * moe_layers) : 0.0;
        }
      }
    }
  if (comm::current_world()->rank() != 0) return 0;
  std::printf("%lld ranks, %d rounds x %d steps, batch %lld x seq %lld (%lld tokens), MoELlama dim %lld, %lld layers "
              "(%lld dense), %lld experts top-%lld of width %lld\n",
              (long long)world, rounds, steps, (long long)batch, (long long)seq, (long long)tokens,
              (long long)c.llama.dim, (long long)c.llama.layers, (long long)c.dense_layers,
              (long long)c.moe.num_experts, (long long)c.moe.top_k, (long long)c.moe_hidden_dim);
  std::printf("%4s %6s %10s %10s %10s %12s %11s %16s %16s %16s\n", "ep", "chunks", "ms/step", "tokens/s", "vs ep=1",
              "a2a share", "cores busy", "all a2a B/fwd", "token a2a B/fwd", "analytic");
  const cpu_set_t allowed = allowed_cpus();
  const int cores = CPU_COUNT(&allowed);
  auto busy_share = [&](const Result& r) { return r.busy_seconds / (r.timed_seconds * cores); };
  const double base = median(results[{degrees[0], 1}].ms);
  for (const auto& [ep, chunks] : variants) {
    const Result& r = results[{ep, chunks}];
    std::printf("%4lld %6lld %10.1f %10.0f %9.2fx %11.1f%% %10.1f%% %16.0f %16.0f %16.0f\n", (long long)ep,
                (long long)chunks, median(r.ms), double(tokens) / (median(r.ms) / 1e3), base / median(r.ms),
                100 * median(r.a2a_share), 100 * busy_share(r), r.bytes, r.token_bytes, r.analytic);
  }
  for (const auto& [ep, chunks] : variants) {
    const Result& r = results[{ep, chunks}];
    if (chunks > 1) {
      const double unchunked = median(results[{ep, 1}].ms);
      std::printf("RESULT moe_tokens_per_s_ep%lld_chunks%lld %.0f tokens/s\n", (long long)ep, (long long)chunks,
                  double(tokens) / (median(r.ms) / 1e3));
      std::printf("RESULT moe_chunked_speedup_ep%lld_chunks%lld %.3f x\n", (long long)ep, (long long)chunks,
                  unchunked / median(r.ms));
      // Each chunk's exchange hides behind the other chunks' experts, but the first dispatch
      // and the last combine have nothing to hide behind: (1 - 1/C) of the unchunked step's
      // exchange wait goes.
      const double hidden = median(results[{ep, 1}].a2a_share) * (1 - 1.0 / double(chunks));
      std::printf("RESULT moe_chunked_speedup_bound_ep%lld_chunks%lld %.3f x\n", (long long)ep, (long long)chunks,
                  1 / (1 - hidden));
      std::printf("RESULT moe_a2a_share_ep%lld_chunks%lld %.3f\n", (long long)ep, (long long)chunks,
                  median(r.a2a_share));
      std::printf("RESULT moe_token_a2a_bytes_over_analytic_ep%lld_chunks%lld %.4f\n", (long long)ep,
                  (long long)chunks, r.token_bytes / r.analytic);
      continue;
    }
    std::printf("RESULT moe_tokens_per_s_ep%lld %.0f tokens/s\n", (long long)ep, double(tokens) / (median(r.ms) / 1e3));
    std::printf("RESULT moe_speedup_ep%lld %.3f x\n", (long long)ep, base / median(r.ms));
    if (ep > 1) {
      std::printf("RESULT moe_a2a_share_ep%lld %.3f\n", (long long)ep, median(r.a2a_share));
      std::printf("RESULT moe_token_a2a_bytes_over_analytic_ep%lld %.4f\n", (long long)ep, r.token_bytes / r.analytic);
      // Whatever the chunks, the cores still do this step's work (its compute, and the
      // communication threads' and the kernel's share of moving the bytes), which it did in
      // the busy share of its time: no chunking gains more than its inverse.
      if (ep == chunked_ep && variants.back().second > 1)
        std::printf("RESULT moe_chunked_speedup_core_bound_ep%lld %.3f x\n", (long long)ep, 1 / busy_share(r));
    }
  }
  return 0;
}
