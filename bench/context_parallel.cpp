// Context parallelism on one small Llama, every rank of the job busy in every configuration:
// the world is split into cp groups of size 1, 2 or 4 (a "rep" dim runs independent
// copies), so all configurations share the same cores and contention. For each sequence
// length, cp degree and mode (cp = 1 runs the model's own attention; hybrid at cp = 4 runs
// Ulysses over 2 ranks inside a ring of 2), the modes taking turns:
//   - activation memory: the peak of CPU storage during a training step minus what was
//     allocated before it (the slowest rank's);
//   - tokens/s of the whole job: replicas x seq / the slowest rank's step time;
//   - bytes a rank hands to the cp groups' attention collectives (all_to_all, all_gather,
//     reduce_scatter, send) per layer, forward and backward, from the collective log,
//     against the planner's volume (hp/plan/cp_traffic.h);
//   - the longest sequence run whose activation memory fits `budget_mib`.
// Then ring attention's load balance at cp = 4: each rank's attention compute (thread CPU
// time) with the head-tail layout and with the contiguous one; the ratio of the slowest
// rank's to the fastest's.
//   build/bin/hprun --nproc-per-node 4 build/bin/bench_context_parallel [max_seq] [rounds] [budget_mib]
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "hp/comm/world.h"
#include "hp/parallel.h"
#include "hp/parallel/context_parallel_kernels.h"
#include "hp/plan/cp_traffic.h"
#include "hp/tensor/memory_stats.h"
#include "slowest_rank.h"

using namespace hp;

namespace {

nn::LlamaConfig bench_llama(int64_t seq) {
  nn::LlamaConfig c;
  c.vocab = 256, c.dim = 64, c.layers = 1, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 128, c.max_seq = seq;
  return c;
}

struct Measure {
  double seconds = 0, activation_mib = 0;
  int64_t attention_bytes = 0;  // per rank per layer, forward + backward
};

// One training step of `model` on `tokens`, the sequence sharded over `cp_dims` (none: no
// context parallelism).
Measure step(nn::Llama& model, const DeviceMesh& mesh, const at::Tensor& tokens, const std::vector<std::string>& cp_dims) {
  const bool cp = !cp_dims.empty();
  const int64_t seq = tokens.size(1) - 1;
  at::Tensor ids = tokens.narrow(1, 0, seq).contiguous(), labels = tokens.narrow(1, 1, seq).contiguous();
  const std::vector<Placement> rep(mesh.ndim(), Replicate());
  comm::CollectiveLog& log = comm::current_world()->collective_log();
  log.clear();
  log.enable(true);
  const int64_t before = cpu_memory_allocated();
  reset_cpu_memory_peak();
  const auto start = std::chrono::steady_clock::now();
  DTensor x = cp ? shard_sequence(ids, mesh, rep, cp_dims) : distribute_tensor(ids, mesh, rep);
  DTensor y = cp ? shard_sequence(labels, mesh, rep, cp_dims) : distribute_tensor(labels, mesh, rep);
  model.loss(x, y).to_local().backward();
  Measure m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.activation_mib = double(cpu_memory_peak() - before) / (1 << 20);
  log.enable(false);
  std::vector<std::vector<int>> cp_groups;
  for (const std::string& d : cp_dims) cp_groups.push_back(mesh.group(d).ranks());
  for (const auto& r : log.records())
    if (std::count(cp_groups.begin(), cp_groups.end(), r.ranks) && r.op != "all_reduce" && r.op != "recv")
      m.attention_bytes += r.bytes();
  m.attention_bytes /= model.config().layers;
  model.zero_grad();
  return m;
}

// What the planner says a rank hands to the attention collectives per layer, forward and
// backward, in the collective log's terms (each rank's input).
double analytic_bytes(CpMode mode, int64_t seq, int64_t cp, int64_t ulysses, const nn::LlamaConfig& c) {
  plan::CpAttentionShape s;
  s.tokens = double(seq), s.heads = c.heads, s.kv_heads = c.kv_heads, s.head_dim = c.head_dim();
  s.element_bytes = 4, s.cp = cp, s.ulysses = ulysses;
  return plan::cp_bytes_per_rank(plan::cp_attention_calls(to_string(mode), s));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t max_seq = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const double budget_mib = argc > 3 ? std::atof(argv[3]) : 64;
  track_cpu_memory();
  comm::init_distributed();
  const int64_t world = comm::current_world()->size();
  HP_CHECK(world % 4 == 0) << "bench_context_parallel: run it on a multiple of 4 ranks, got " << world;
  const bool root = comm::current_world()->rank() == 0;

  struct Config {
    int64_t cp;
    CpMode mode;
    int64_t ulysses = 1;  // hybrid: the inner dim's size
    std::string name() const { return cp == 1 ? "cp1" : std::string(to_string(mode)) + "_cp" + std::to_string(cp); }
  };
  std::vector<Config> configs{{1, CpMode::ring}};
  for (int64_t cp : {2, 4})
    for (CpMode m : {CpMode::ulysses, CpMode::ring, CpMode::allgather_kv}) configs.push_back({cp, m});
  configs.push_back({4, CpMode::hybrid, 2});

  std::map<std::string, std::map<int64_t, Measure>> best;  // per config, per seq: the slowest rank's
  std::vector<std::string> lines;
  for (int64_t seq = 1024; seq <= max_seq; seq *= 2) {
    const nn::LlamaConfig c = bench_llama(seq);
    for (int round = 0; round < rounds; ++round)
      for (const Config& cfg : configs) {
        const bool hybrid = cfg.ulysses > 1;
        DeviceMesh mesh = hybrid ? init_device_mesh("cpu", {world / cfg.cp, cfg.cp / cfg.ulysses, cfg.ulysses},
                                                    {"rep", "cp", "cp_uly"})
                                 : init_device_mesh("cpu", {world / cfg.cp, cfg.cp}, {"rep", "cp"});
        std::vector<std::string> cp_dims;
        if (cfg.cp > 1) cp_dims.push_back("cp");
        if (hybrid) cp_dims.push_back("cp_uly");
        manual_seed(7);
        nn::Llama model(c, mesh);
        ContextParallelOptions o;
        o.mode = cfg.mode;
        if (hybrid) o.ulysses_dim = "cp_uly";
        if (cfg.cp > 1) parallelize_module(model, mesh["cp"], {{"layers.*.attn", ContextParallel(o)}});
        const at::Tensor tokens = (hp::rand({1, seq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
        Measure m = step(model, mesh, tokens, cp_dims);
        auto worst = slowest_rank_medians(mesh.whole_group(), {m.seconds, m.activation_mib}, 1, 2);
        Measure& b = best[cfg.name()][seq];
        if (round == 0 || worst[0] < b.seconds) b.seconds = worst[0];
        b.activation_mib = worst[1];
        b.attention_bytes = m.attention_bytes;
      }
    for (const Config& cfg : configs) {
      const Measure& m = best[cfg.name()][seq];
      const double tok_s = double(world / cfg.cp) * double(seq) / m.seconds;
      const double ratio = best[cfg.name()][seq].activation_mib / best["cp1"][seq].activation_mib;
      char line[256];
      std::snprintf(line, sizeof line, "seq %6lld  %-16s  %9.0f tok/s  activations %8.1f MiB (%.2fx cp1)",
                    (long long)seq, cfg.name().c_str(), tok_s, m.activation_mib, ratio);
      std::string text = line;
      if (cfg.cp > 1) {
        std::snprintf(line, sizeof line, "  attention bytes/layer %9.3f MiB (analytic %9.3f)",
                      double(m.attention_bytes) / (1 << 20), analytic_bytes(cfg.mode, seq, cfg.cp, cfg.ulysses, c) / (1 << 20));
        text += line;
      }
      if (root) std::printf("%s\n", text.c_str());
      lines.push_back("RESULT cp_tokens_per_s_" + cfg.name() + "_seq" + std::to_string(seq) + " " +
                      std::to_string(tok_s));
      lines.push_back("RESULT cp_activation_ratio_" + cfg.name() + "_seq" + std::to_string(seq) + " " +
                      std::to_string(ratio));
      if (cfg.cp > 1)
        lines.push_back("RESULT cp_bytes_vs_analytic_" + cfg.name() + "_seq" + std::to_string(seq) + " " +
                        std::to_string(double(m.attention_bytes) / analytic_bytes(cfg.mode, seq, cfg.cp, cfg.ulysses, c)));
    }
  }
  for (const Config& cfg : configs) {
    int64_t longest = 0;
    for (const auto& [seq, m] : best[cfg.name()])
      if (m.activation_mib <= budget_mib) longest = seq;
    lines.push_back("RESULT cp_longest_seq_" + cfg.name() + "_within_" + std::to_string(int(budget_mib)) + "MiB " +
                    std::to_string(longest));
  }

  // Ring load balance at cp = 4 on the longest sequence: attention compute per rank.
  {
    const int64_t seq = max_seq;
    DeviceMesh mesh = init_device_mesh("cpu", {world / 4, 4}, {"rep", "cp"});
    const nn::LlamaConfig c = bench_llama(seq);
    std::map<bool, double> ratio, work;
    for (int round = 0; round < rounds; ++round)
      for (bool balance : {true, false}) {
        manual_seed(7);
        DTensor q = hp::randn({1, c.heads, seq, c.head_dim()}, mesh, {Replicate(), Shard(2)});
        DTensor kv = hp::randn({1, c.kv_heads, seq, c.head_dim()}, mesh, {Replicate(), Shard(2)});
        q.to_local().requires_grad_();
        kv.to_local().requires_grad_();
        nn::Rotary rotary(c.rope_theta);
        ContextParallelOptions o;
        o.load_balance = balance;
        cp::ring_attention_stats() = {};
        context_parallel_attention(nn::AttentionCoreInputs{q, kv, kv, rotary, true}, 1, o).to_local().sum().backward();
        const cp::RingAttentionStats s = cp::ring_attention_stats();
        at::Tensor t = at::tensor({s.compute_seconds, -s.compute_seconds, double(s.score_elements),
                                   -double(s.score_elements)}, at::kDouble);
        comm::all_reduce_(t, mesh.group("cp"), ReduceOp::Max);
        const double r = t[0].item<double>() / -t[1].item<double>();
        if (round == 0 || r < ratio[balance]) ratio[balance] = r;
        work[balance] = t[2].item<double>() / -t[3].item<double>();
      }
    if (root)
      std::printf("ring cp4 seq %lld: slowest/fastest rank attention compute %.3fx balanced, %.3fx contiguous "
                  "(scored pairs %.3fx, %.3fx)\n",
                  (long long)seq, ratio[true], ratio[false], work[true], work[false]);
    lines.push_back("RESULT cp_ring_imbalance_balanced " + std::to_string(ratio[true]));
    lines.push_back("RESULT cp_ring_imbalance_contiguous " + std::to_string(ratio[false]));
    lines.push_back("RESULT cp_ring_work_imbalance_balanced " + std::to_string(work[true]));
    lines.push_back("RESULT cp_ring_work_imbalance_contiguous " + std::to_string(work[false]));
  }
  if (root)
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
