// An MPMD pipeline against the same model with one rank per stage, in one run: a vision
// encoder stage feeding a Llama decoder stage (nn::VisionEncoder, nn::image_text_loss),
// 1F1B, float32, ranks as threads with one intra-op thread each. Layouts:
//   1+1      encoder on rank 0, decoder on rank 1 (the baseline)
//   1+tp2    decoder tensor parallel over 2 ranks
//   fsdp2+tp2  encoder fully_shard over 2 ranks, decoder tensor parallel over 2
// Prints the median step time, its ratio to 1+1, and the bytes that cross between the
// stage meshes per step under the whole-tensor transfer and under per-receiver pieces.
//
//   bench_pipeline_mpmd [microbatches=4] [rows per microbatch=8] [dim=128] [steps=6]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "hp/comm.h"
#include "hp/parallel.h"
#include "hp/pipeline.h"
#include "hp/schedule.h"

using namespace hp;

namespace {

struct Config {
  int microbatches = 4, rows = 8, dim = 128, steps = 6;
};

struct Layout {
  const char* name;
  int64_t enc_ranks;
  bool enc_fully_shard;
  int64_t dec_tp;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

nn::VisionConfig vision(const Config& c) {
  nn::VisionConfig v;
  v.image = 16, v.channels = 3, v.patch = 4, v.out_dim = c.dim;  // 16 image tokens
  v.blocks.dim = c.dim, v.blocks.layers = 2, v.blocks.heads = 4, v.blocks.kv_heads = 2, v.blocks.ffn_dim = 3 * c.dim;
  return v;
}

nn::LlamaConfig decoder(const Config& c) {
  nn::LlamaConfig l;
  l.vocab = 256, l.dim = c.dim, l.layers = 4, l.heads = 4, l.kv_heads = 2, l.ffn_dim = 3 * c.dim, l.max_seq = 64;
  return l;
}

constexpr int64_t kText = 32;

// Median ms per step on rank 0 (the encoder's first rank).
double run(const Config& c, const Layout& L) {
  const MeshShape enc_mesh({L.enc_ranks}, {"dp"}, [&] {
    std::vector<int> r;
    for (int k = 0; k < L.enc_ranks; ++k) r.push_back(k);
    return r;
  }());
  std::vector<int> dec_ranks;
  for (int k = 0; k < L.dec_tp; ++k) dec_ranks.push_back(static_cast<int>(L.enc_ranks) + k);
  const MeshShape dec_mesh({1, L.dec_tp}, {"dp", "tp"}, dec_ranks);
  const int64_t batch = int64_t(c.rows) * c.microbatches;
  at::Tensor images = at::randn({batch, 3, 16, 16});
  at::Tensor tokens = at::randint(256, {batch, kText + 1}, at::kLong);
  double median = 0;
  std::mutex mu;
  comm::run_local_ranks(static_cast<int>(L.enc_ranks + L.dec_tp), [&](int rank) {
    at::set_num_threads(1);
    const bool encoder = enc_mesh.contains(rank);
    DeviceMesh mesh("cpu", encoder ? enc_mesh : dec_mesh);
    manual_seed(encoder ? 1 : 2);
    std::unique_ptr<nn::VisionEncoder> enc;
    std::unique_ptr<nn::Llama> dec;
    pipeline::MeshStageOptions o;
    o.num_stages = 2;
    o.group = comm::current_world()->world_group();
    if (encoder) {
      enc = std::make_unique<nn::VisionEncoder>(vision(c), mesh);
      o.input_placements = {Replicate()};
      if (L.enc_fully_shard) {
        for (auto& [n, m] : enc->named_modules())
          if (name_matches("layers.*", n)) fully_shard(*m, mesh);
        FSDPModule root = fully_shard(*enc, mesh);
        o.set_requires_gradient_sync = [root](bool on) mutable { root.set_requires_gradient_sync(on); };
        o.input_placements = {Shard(0)};
      }
      o.forward = [&](const DTensor& x) { return (*enc)(x); };
      o.parameters = enc->parameters();
    } else {
      dec = std::make_unique<nn::Llama>(decoder(c), mesh);
      if (L.dec_tp > 1) parallelize_llama(*dec, mesh["tp"]);
      o.stage_index = 1;
      o.input_placements = {Replicate(), Replicate()};
      o.forward = [](const DTensor& x) { return x; };
      o.loss = [&](const DTensor& img, const at::Tensor& t) {
        return nn::image_text_loss(*dec, img, distribute_tensor(t, mesh, {Replicate(), Replicate()}));
      };
      o.parameters = dec->parameters();
    }
    pipeline::PipelineRuntime rt({pipeline::mesh_stage(mesh, o)}, schedule::make_schedule("1f1b", 2, c.microbatches),
                                 {enc_mesh, dec_mesh});
    std::vector<double> times;
    for (int step = 0; step < c.steps + 1; ++step) {  // the first step warms up
      double t0 = now_s();
      rt.step(encoder ? images : at::Tensor(), encoder ? at::Tensor() : tokens);
      if (step > 0) times.push_back(now_s() - t0);
      for (DTensor* p : o.parameters) p->to_local().mutable_grad() = at::Tensor();
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      median = times[times.size() / 2] * 1e3;
    }
  });
  return median;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (argc > 1) c.microbatches = std::atoi(argv[1]);
  if (argc > 2) c.rows = std::atoi(argv[2]);
  if (argc > 3) c.dim = std::atoi(argv[3]);
  if (argc > 4) c.steps = std::atoi(argv[4]);
  const std::vector<Layout> layouts{{"1+1", 1, false, 1}, {"1+tp2", 1, false, 2}, {"fsdp2+tp2", 2, true, 2}};
  std::printf("MPMD bench: vision encoder (16 image tokens, 2 blocks) -> Llama decoder (4 blocks, %lld text tokens), "
              "dim %d, 1F1B, %d microbatches of %d rows, %d steps, %u cores\n",
              static_cast<long long>(kText), c.dim, c.microbatches, c.rows, c.steps,
              std::thread::hardware_concurrency());
  std::printf("%-10s %6s %10s %8s %16s %16s\n", "layout", "ranks", "ms/step", "vs 1+1", "MiB/step whole",
              "MiB/step pieces");
  double base = 0;
  for (const Layout& L : layouts) {
    double ms = run(c, L);
    if (base == 0) base = ms;
    // Per microbatch the activation [rows, 16, dim] goes forward and its grad back.
    const double act = double(c.rows) * 16 * c.dim * 4 / (1 << 20) * c.microbatches;
    // Whole: every receiving rank gets the whole tensor, both ways.
    const double whole = act * L.dec_tp + act * L.enc_ranks;
    // Pieces: the decoder wants its input Replicate (whole on each tp rank anyway); the
    // grad goes back as each encoder rank's rows only when the encoder shards them.
    const double pieces = act * L.dec_tp + act * (L.enc_fully_shard ? 1 : L.enc_ranks);
    std::printf("%-10s %6lld %10.1f %8.2f %16.2f %16.2f\n", L.name, static_cast<long long>(L.enc_ranks + L.dec_tp),
                ms, ms / base, whole, pieces);
  }
  return 0;
}
