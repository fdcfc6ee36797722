// Activation checkpointing and optimizer-state offload: memory and step time of one
// training step, by mode:
//   bench_memory [LAYERS] [BATCH] [ROUNDS] [STEPS] [MODES]  (default 4 8 3 2 all; one process)
// The 3.03M Llama of configs/bench_3m.toml (vocab 256, dim 256, 8 heads / 4 kv heads, SwiGLU
// 688, sequence 256) with LAYERS blocks, BATCH sequences, float32. Modes: none (AdamW in
// memory), full (every block recomputed), full_chunked (and each block's MLP a region inside
// it, recomputed in 4 token chunks during the block's backward), selective
// (save_matmuls_and_collectives), budget 0.5 and 0.4, and 0.4 and 0.22 with
// release_at_next_region (budget40_next, budget22_next: the last block, whose backward
// comes first, keeps all it made and replays nothing), swap (swap_wrapper: every activation a
// block's backward reads in files under $TMPDIR or /tmp, written behind the next block's
// forward and read back one at a time as the backward needs them, the next one meanwhile:
// nothing replays), budget40_swap (budget 0.4 with those files as its swap tier: the
// products it does not keep go there, the rest is recomputed), offload (SwapOptimizer over
// AdamW, state in files under $TMPDIR or /tmp, 8 batches, prefetch) and offload_noprefetch;
// muon (Muon on the blocks' matrices, AdamW on the rest, in memory) and muon_offload (that
// chain per batch in a SwapOptimizer, with
// prefetch; its ratios against muon). One model: each round runs every mode in turn (first
// mode rotating), each with a fresh optimizer (two untimed steps allocate its state and
// settle the allocator's heap), so
// all modes see the same machine and model. MODES, a comma-separated list, runs only those
// (and none, which the ratios need) and skips the fully_shard table.
//
// Per step: wall time; the time spent recomputing (memory::recompute_seconds); the
// activation peak, the high-water mark of the counted CPU storage (hp::track_cpu_memory)
// during forward + backward above what was allocated before the forward; and the step's
// peak, the high-water mark of all counted storage over forward, backward and the
// optimizer step (parameters, gradients, optimizer state, activations).
// Per mode: the process's peak RSS over its steps (VmHWM, reset through
// /proc/self/clear_refs). Medians over all steps of a mode; ratios against none. The
// planner's figures for the same model (plan/memory.h, plan/estimator.h) are printed
// beside them. With selective among the modes, the least step time at which recomputing
// can bring the activation peak to 0.5x of none's on this CPU (the selective
// target), from selective's peak and replay and the model's products timed here.
//
// fully_shard offload (one rank, so a shard is a whole parameter): fsdp (AdamW in memory),
// fsdp_optoffload (SwapOptimizer, state in files) and fsdp_offload (FileOffloadPolicy:
// parameters and gradients in files too, streamed by the SwapOptimizer with the state),
// and fsdp_offload with gradient clipping (max norm 1): fsdp_offload_clip streams the
// gradients through clip_grad_norm_ one parameter at a time, fsdp_offload_clip_in brings
// them all in first. A fresh model per mode and round, modes alternating; per step the wall time, the step's
// peak of counted storage above what was allocated before the model was built, and what
// stays allocated between steps. RESULT lines last.
#include <ATen/ATen.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/memory.h"
#include "hp/nn.h"
#include "hp/optim/adamw.h"
#include "hp/optim/chained.h"
#include "hp/parallel.h"
#include "hp/plan/estimator.h"
#include "hp/plan/flops.h"
#include "hp/plan/memory.h"
#include "hp/plan/model_desc.h"
#include "hp/tensor/memory_stats.h"
#include "hp/tensor/random.h"

using namespace hp;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Peak RSS in bytes since the last reset_peak_rss().
double peak_rss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  return 0;
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Mode {
  std::string name;
  bool checkpointed = false;
  CheckpointOptions options;
  int offload = 0;  // 0: in memory; 1: SwapOptimizer with prefetch; 2: without
  bool muon = false;  // Muon + AdamW (get_hyper_optimizer's split), else AdamW
  std::optional<CheckpointOptions> inner;  // the blocks' MLPs checkpointed inside them too
};

std::string temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/hp_bench_memory_XXXXXX";
  HP_CHECK(::mkdtemp(dir.data()) != nullptr) << "mkdtemp " << dir;
  return dir;
}

std::vector<Mode> modes() {
  Mode none{"none"}, full{"full", true}, sel{"selective", true}, half{"budget50", true}, b40{"budget40", true};
  sel.options.policy = save_matmuls_and_collectives;
  half.options.memory_budget = 0.5;
  b40.options.memory_budget = 0.4;
  Mode off{"offload"}, off_np{"offload_noprefetch"}, muon{"muon"}, muon_off{"muon_offload"};
  off.offload = 1, off_np.offload = 2;
  muon.muon = muon_off.muon = true, muon_off.offload = 1;
  Mode chunked{"full_chunked", true};
  chunked.inner = CheckpointOptions();
  chunked.inner->token_chunks = 4;
  Mode b40_next{"budget40_next", true}, b22_next{"budget22_next", true};
  b40_next.options.memory_budget = 0.4, b22_next.options.memory_budget = 0.22;
  b40_next.options.release_at_next_region = b22_next.options.release_at_next_region = true;
  Mode swap{"swap", true};
  swap.options = swap_options(std::make_shared<memory::FileTier>(temp_dir()));
  Mode b40_swap{"budget40_swap", true};
  b40_swap.options.memory_budget = 0.4;
  b40_swap.options.swap_tier = swap.options.swap_tier;
  return {none, full, chunked, sel, half, b40, b40_next, b22_next, swap, b40_swap, off, off_np, muon, muon_off};
}

std::unique_ptr<optim::Optimizer> make_optimizer(nn::Llama& model, const Mode& m, int64_t batch_bytes) {
  optim::AdamWOptions ao;
  ao.lr = 1e-3;
  memory::OptimizerFactory make = [ao](std::vector<DTensor*> ps) { return std::make_unique<optim::AdamW>(ps, ao); };
  if (m.muon) make = optim::hyper_optimizer_parts(model, optim::MuonOptions{}, ao);
  if (m.offload == 0) return make(model.parameters());
  const std::string dir = temp_dir();
  memory::SwapOptimizerOptions so;
  so.batch_bytes = batch_bytes;
  so.prefetch = m.offload == 1;
  return std::make_unique<memory::SwapOptimizer>(model.parameters(), make, std::make_shared<memory::FileTier>(dir), so);
}

// Bytes of the optimizer state `opt` holds when it is all in memory.
double state_bytes(optim::Optimizer& opt) {
  double n = 0;
  for (const optim::StateEntry& e : opt.state()) n += double(e.local->nbytes());
  return n;
}

struct FsdpRows {
  std::map<std::string, std::vector<double>> time, peak, between;
};

// One mode's model, optimizer and steps; offloaded files under `dir`.
void run_fsdp_mode(const std::string& name, const std::string& dir, const nn::LlamaConfig& c, const DTensor& ids,
                   const DTensor& targets, int steps, FsdpRows& rows) {
  optim::AdamWOptions ao;
  ao.lr = 1e-3;
  auto adamw = [ao](std::vector<DTensor*> ps) { return std::make_unique<optim::AdamW>(ps, ao); };
  const int64_t base = cpu_memory_allocated();
  manual_seed(0);
  auto model = std::make_unique<nn::Llama>(c, ids.device_mesh());
  FullyShardOptions o;
  const bool shards_out = name.rfind("fsdp_offload", 0) == 0;
  if (shards_out) o.offload_policy = FileOffloadPolicy{dir + "/shards"};
  FSDPModule root = fully_shard_llama(*model, ids.device_mesh()["dp"], o);
  int64_t param_bytes = 0;
  for (DTensor* p : model->parameters()) param_bytes += static_cast<int64_t>(p->to_local().nbytes());
  const std::shared_ptr<memory::OffloadedParameters> so_view = root.offloaded_parameters();
  std::unique_ptr<optim::Optimizer> opt;
  if (name == "fsdp") {
    opt = adamw(model->parameters());
  } else {
    memory::SwapOptimizerOptions so;
    so.batch_bytes = param_bytes / 8;
    if (shards_out) so.parameters = root.offloaded_parameters();
    opt = std::make_unique<memory::SwapOptimizer>(model->parameters(), adamw,
                                                  std::make_shared<memory::FileTier>(dir + "/optimizer"), so);
  }
  // Steps 0 and 1 untimed: the first allocates the optimizer state, the second settles the
  // allocator's heap with it.
  for (int s = 0; s < steps + 2; ++s) {
    reset_cpu_memory_peak();
    auto t0 = Clock::now();
    model->loss(ids, targets).to_local().backward();
    if (name == "fsdp_offload_clip") optim::clip_grad_norm_(model->parameters(), 1.0, nullptr, so_view.get());
    if (name == "fsdp_offload_clip_in") {
      root.bring_in_offloaded();
      optim::clip_grad_norm_(model->parameters(), 1.0);
    }
    opt->step();
    opt->zero_grad();
    const double time = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < 2) continue;
    rows.time[name].push_back(time);
    rows.peak[name].push_back(double(cpu_memory_peak() - base));
    rows.between[name].push_back(double(cpu_memory_allocated() - base));
  }
}

// fsdp, fsdp_optoffload and fsdp_offload (above), RESULT lines into `results`.
void fsdp_rows(const nn::LlamaConfig& c, const DTensor& ids, const DTensor& targets, int rounds, int steps,
               std::vector<std::string>& results) {
  const std::vector<std::string> names{"fsdp", "fsdp_optoffload", "fsdp_offload", "fsdp_offload_clip",
                                       "fsdp_offload_clip_in"};
  FsdpRows rows;
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[(i + r) % names.size()];
      const std::string dir = temp_dir();
      run_fsdp_mode(name, dir, c, ids, targets, steps, rows);
      std::filesystem::remove_all(dir);
    }
  std::printf("%-21s %9s %7s %14s %7s %17s\n", "fully_shard, 1 rank", "step ms", "ratio", "step peak MiB", "ratio",
              "between steps MiB");
  const double t0 = median(rows.time["fsdp"]), p0 = median(rows.peak["fsdp"]);
  for (const std::string& n : names)
    std::printf("%-21s %9.1f %7.3f %14.1f %7.3f %17.1f\n", n.c_str(), 1e3 * median(rows.time[n]),
                median(rows.time[n]) / t0, median(rows.peak[n]) / (1 << 20), median(rows.peak[n]) / p0,
                median(rows.between[n]) / (1 << 20));
  const std::string tag = "L" + std::to_string(c.layers);
  auto result = [&](const std::string& key, double v) {
    char line[160];
    std::snprintf(line, sizeof line, "RESULT memory_%s_%s %.3f", key.c_str(), tag.c_str(), v);
    results.push_back(line);
  };
  const double t1 = median(rows.time["fsdp_optoffload"]), p1 = median(rows.peak["fsdp_optoffload"]);
  result("fsdp_offload_step_time_ratio", median(rows.time["fsdp_offload"]) / t0);
  result("fsdp_offload_step_time_ratio_vs_optoffload", median(rows.time["fsdp_offload"]) / t1);
  result("fsdp_offload_step_peak_ratio", median(rows.peak["fsdp_offload"]) / p0);
  result("fsdp_offload_step_peak_ratio_vs_optoffload", median(rows.peak["fsdp_offload"]) / p1);
  result("fsdp_between_steps_mib", median(rows.between["fsdp"]) / (1 << 20));
  result("fsdp_offload_between_steps_mib", median(rows.between["fsdp_offload"]) / (1 << 20));
  // Clipping: streamed against every gradient brought in.
  result("fsdp_offload_clip_step_peak_ratio_vs_brought_in",
         median(rows.peak["fsdp_offload_clip"]) / median(rows.peak["fsdp_offload_clip_in"]));
  result("fsdp_offload_clip_step_time_ratio_vs_brought_in",
         median(rows.time["fsdp_offload_clip"]) / median(rows.time["fsdp_offload_clip_in"]));
}

// Milliseconds per MiB of output of the model's cheapest product per byte, timed here: a
// linear over the model's width (q, k, v, o, gate, up: two multiply-adds per element and
// input column), at each of their shapes, the fastest of 20 calls; the down projection
// reads ffn_dim columns and attention the whole sequence, which cost more per byte.
double product_ms_per_mib(int64_t rows, const nn::LlamaConfig& c) {
  const int64_t kv = c.dim / c.heads * c.kv_heads;
  const at::Tensor x = at::randn({rows, c.dim});
  double best = 1e30;
  for (int64_t n : {c.dim, kv, c.ffn_dim}) {
    const at::Tensor w = at::randn({n, c.dim});
    for (int i = 0; i < 23; ++i) {
      const auto t0 = Clock::now();
      const at::Tensor y = at::linear(x, w);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (i >= 3) best = std::min(best, ms / (double(y.nbytes()) / (1 << 20)));
    }
  }
  return best;
}

void set_mode(nn::Llama& model, const Mode& m) {
  for (auto& [name, mod] : model.named_modules())
    if (name.rfind("layers.", 0) == 0 && name.find('.', 7) == std::string::npos) {
      mod->set_forward_wrapper(nullptr);
      if (m.checkpointed) checkpoint_wrapper(*mod, m.options);
      for (auto& [sub, inner] : mod->named_modules())
        if (sub == "mlp") {
          inner->set_forward_wrapper(nullptr);
          if (m.inner) checkpoint_wrapper(*inner, *m.inner);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t layers = argc > 1 ? std::stoll(argv[1]) : 4;
  const int64_t batch = argc > 2 ? std::stoll(argv[2]) : 8;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 3;
  const int steps = argc > 4 ? std::stoi(argv[4]) : 2;
  const std::string only = argc > 5 ? std::string(",") + argv[5] + ",none," : "";
  const int64_t seq = 256;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(0);
    nn::LlamaConfig c;
    c.vocab = 256, c.dim = 256, c.layers = layers, c.heads = 8, c.kv_heads = 4, c.ffn_dim = 688, c.max_seq = seq;
    nn::Llama model(c, mesh);
    int64_t param_bytes = 0;
    for (DTensor* p : model.parameters()) param_bytes += static_cast<int64_t>(p->to_local().nbytes());
    std::unique_ptr<optim::Optimizer> opt;
    const at::Tensor tokens = (rand({batch, seq + 1}, at::kDouble) * c.vocab).floor().to(at::kLong);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, seq).contiguous(), mesh, {Replicate()});
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, seq).contiguous(), mesh, {Replicate()});
    track_cpu_memory();
    struct Step {
      double time, act, peak, recompute;
    };
    auto step = [&]() {
      reset_cpu_memory_peak();
      const int64_t before = cpu_memory_allocated();
      const double recomputed_before = memory::recompute_seconds();
      auto t0 = Clock::now();
      model.loss(ids, targets).to_local().backward();
      const double act = double(cpu_memory_peak() - before);
      const double recompute = memory::recompute_seconds() - recomputed_before;
      opt->step();
      for (DTensor* p : model.parameters()) p->to_local().mutable_grad().zero_();  // stay allocated
      return Step{std::chrono::duration<double>(Clock::now() - t0).count(), act, double(cpu_memory_peak()), recompute};
    };
    std::vector<Mode> ms = modes();
    if (!only.empty())
      ms.erase(std::remove_if(ms.begin(), ms.end(),
                              [&](const Mode& m) { return only.find("," + m.name + ",") == std::string::npos; }),
               ms.end());
    std::map<std::string, std::vector<double>> time, act, peak, rss, recompute;
    double muon_state = 0;
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < ms.size(); ++i) {
        const Mode& m = ms[(i + r) % ms.size()];
        set_mode(model, m);
        opt.reset();
        opt = make_optimizer(model, m, param_bytes / 8);
        if (m.name == "muon") muon_state = state_bytes(*opt);
        step();  // allocates gradients and optimizer state
        // Its activations beside that state: the allocator's heap as the timed steps find it
        // (after one step alone, the next forward touched some 70 MiB of new pages in none).
        step();
        reset_peak_rss();
        for (int s = 0; s < steps; ++s) {
          Step st = step();
          time[m.name].push_back(st.time);
          act[m.name].push_back(st.act);
          peak[m.name].push_back(st.peak);
          recompute[m.name].push_back(st.recompute);
        }
        rss[m.name].push_back(peak_rss());
      }
    opt.reset();
    std::vector<std::string> fsdp_results;
    if (only.empty()) fsdp_rows(c, ids, targets, rounds, steps, fsdp_results);
    plan::ModelDesc d;
    d.name = "bench", d.layers = layers, d.hidden = c.dim, d.heads = c.heads, d.kv_heads = c.kv_heads;
    d.ffn = c.ffn_dim, d.vocab = c.vocab, d.seq_len = seq;
    const double layer_none = plan::layer_activation_bytes_per_token(d, false, plan::Recompute::None);
    const double layer_sel = plan::layer_activation_bytes_per_token(d, false, plan::Recompute::Selective);
    const double layer_full = plan::layer_activation_bytes_per_token(d, false, plan::Recompute::Full);
    const double layers_share = double(layers) * plan::layer_forward_flops_per_token(d, false) /
                                (3 * plan::forward_flops_per_token(d));  // of a step's FLOPs, one forward of the layers
    const double planned_sel_time = 1 + plan::EstimatorOptions().selective_recompute_cost * layers_share;
    // The estimator's fp32-eager count of this run's activations and logits, per recompute.
    auto estimated_activations = [&](plan::Recompute r) {
      plan::Strategy s;
      s.dp = 1, s.global_batch = batch, s.micro_batch = batch, s.microbatches = 1, s.recompute = r;
      plan::StageContents all;
      all.dense_layers = layers, all.embedding = true, all.head = true;
      const plan::MemoryBreakdown m = plan::stage_memory(d, s, all, 0, 1, plan::numerics_preset("fp32-eager"));
      return m.activations + m.logits;
    };
    const double est_none = estimated_activations(plan::Recompute::None);

    std::printf("Llama %lld layers, dim 256, batch %lld x seq %lld, %d rounds x %d steps per mode\n",
                (long long)layers, (long long)batch, (long long)seq, rounds, steps);
    std::printf("%-19s %9s %7s %13s %7s %14s %13s %13s\n", "mode", "step ms", "ratio", "act peak MiB", "ratio",
                "step peak MiB", "peak RSS MiB", "recompute ms");
    const double t0 = median(time["none"]), a0 = median(act["none"]), p0 = median(peak["none"]);
    for (const Mode& m : ms)
      std::printf("%-19s %9.1f %7.3f %13.1f %7.3f %14.1f %13.1f %13.1f\n", m.name.c_str(), 1e3 * median(time[m.name]),
                  median(time[m.name]) / t0, median(act[m.name]) / (1 << 20), median(act[m.name]) / a0,
                  median(peak[m.name]) / (1 << 20), median(rss[m.name]) / (1 << 20), 1e3 * median(recompute[m.name]));
    const double state = 2.0 * double(param_bytes);  // AdamW's exp_avg and exp_avg_sq
    double p_muon = 0, t_muon = 0;
    if (only.empty()) {
      std::printf("AdamW state %.1f MiB; offload lowers the step peak by %.1f MiB (%.2f of it)\n", state / (1 << 20),
                  (p0 - median(peak["offload"])) / (1 << 20), (p0 - median(peak["offload"])) / state);
      p_muon = median(peak["muon"]), t_muon = median(time["muon"]);
      std::printf("Muon + AdamW state %.1f MiB; muon_offload lowers the step peak by %.1f MiB (%.2f of it), step time "
                  "%.3fx of muon's\n",
                  muon_state / (1 << 20), (p_muon - median(peak["muon_offload"])) / (1 << 20),
                  (p_muon - median(peak["muon_offload"])) / muon_state, median(time["muon_offload"]) / t_muon);
    }
    // One more forward of the layers, less the products only the residual add reads.
    const double planned_full_time =
        1 + double(layers) * plan::recomputed_layer_flops_per_token(d, false) / (3 * plan::forward_flops_per_token(d));
    std::printf("planner, per layer's saved activations: selective %.3f, full %.3f of none; step time "
                "selective %.2fx, full %.2fx (FLOPs)\n",
                layer_sel / layer_none, layer_full / layer_none, planned_sel_time, planned_full_time);
    std::printf("estimator (fp32-eager), this model's activations and logits: selective %.3f, full %.3f, "
                "full_chunked %.3f of none\n",
                estimated_activations(plan::Recompute::Selective) / est_none,
                estimated_activations(plan::Recompute::Full) / est_none,
                estimated_activations(plan::Recompute::FullChunked) / est_none);
    std::printf("target full: activation peak <= 1/L + one layer = %.3f of none\n", 2.0 / double(layers));
    const std::string tag = "L" + std::to_string(layers);
    // The selective target's time bound when recomputing (not swapping): below selective's
    // peak, which keeps only the products (and the blocks' inputs, which every mode keeps),
    // every MiB less at the peak is a MiB of products dropped, and recomputed at no less
    // than the fastest product's rate; beside selective's replay of all the rest, which
    // costs less per MiB.
    double time_bound = 0;
    if (act.count("selective")) {
      const double products = std::max(0.0, median(act["selective"]) - 0.5 * a0) / (1 << 20);
      const double ms_per_mib = product_ms_per_mib(batch * seq, c);
      const double replay = 1e3 * median(recompute["selective"]);
      time_bound = (1e3 * t0 + replay + products * ms_per_mib) / (1e3 * t0);
      std::printf("bound, recomputing: activation peak <= 0.5x of none drops %.1f MiB of products more than selective, "
                  "each MiB recomputed in >= %.2f ms (the model's fastest product per byte, timed here), beside "
                  "selective's replay (%.1f ms): step time >= %.3fx\n",
                  products, ms_per_mib, replay, time_bound);
    }
    for (const Mode& m : ms) {
      if (m.name == "none" || m.offload) continue;
      std::printf("RESULT memory_%s_act_peak_ratio_%s %.3f\n", m.name.c_str(), tag.c_str(), median(act[m.name]) / a0);
      std::printf("RESULT memory_%s_step_time_ratio_%s %.3f\n", m.name.c_str(), tag.c_str(),
                  median(time[m.name]) / t0);
      // What the recompute alone adds, as a share of none's step: the time ratio's floor.
      if (m.checkpointed)
        std::printf("RESULT memory_%s_recompute_share_%s %.3f\n", m.name.c_str(), tag.c_str(),
                    median(recompute[m.name]) / t0);
    }
    if (only.empty()) {
      std::printf("RESULT memory_offload_peak_drop_of_state_%s %.3f\n", tag.c_str(), (p0 - median(peak["offload"])) / state);
      std::printf("RESULT memory_offload_step_time_ratio_%s %.3f\n", tag.c_str(), median(time["offload"]) / t0);
      std::printf("RESULT memory_offload_noprefetch_step_time_ratio_%s %.3f\n", tag.c_str(),
                  median(time["offload_noprefetch"]) / t0);
      std::printf("RESULT memory_muon_offload_peak_drop_of_state_%s %.3f\n", tag.c_str(),
                  (p_muon - median(peak["muon_offload"])) / muon_state);
      std::printf("RESULT memory_muon_offload_step_time_ratio_%s %.3f\n", tag.c_str(), median(time["muon_offload"]) / t_muon);
    }
    if (time_bound > 0) std::printf("RESULT memory_selective_target_time_bound_%s %.3f\n", tag.c_str(), time_bound);
    std::printf("RESULT memory_none_act_peak_mib_%s %.1f\n", tag.c_str(), a0 / (1 << 20));
    for (const std::string& line : fsdp_results) std::printf("%s\n", line.c_str());
  });
  return 0;
}
