// A vision-language model trained as an MPMD pipeline on 3 ranks: a small vision encoder
// on rank 0 (stage 0, one rank) feeds its image tokens to a Llama decoder on ranks 1-2
// (stage 1, tensor parallel over tp=2), which reads them before the text. 1F1B over 4
// microbatches; the synthetic task: each image shows one of a few classes (a fixed
// pattern plus noise) and its caption is a token sequence that depends on the class, so
// the decoder must look at the image to predict the caption.
//
// Run: build/bin/hprun --nproc-per-node 3 build/bin/vision_llm [steps]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "hp/optim/adamw.h"
#include "hp/parallel.h"
#include "hp/pipeline.h"
#include "hp/schedule.h"

namespace {

constexpr int64_t kClasses = 4, kBatch = 16, kText = 8, kVocab = 32;
constexpr int kMicrobatches = 4;

struct Batch {
  at::Tensor images;  // [B, 3, 8, 8]
  at::Tensor tokens;  // [B, kText + 1]
};

// The same on every rank: a pure function of the step.
Batch synthetic_batch(int step) {
  auto fixed = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor patterns = at::randn({kClasses, 3, 8, 8}, fixed);
  at::Tensor captions = at::randint(kVocab, {kClasses, kText + 1}, fixed, at::kLong);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor cls = at::randint(kClasses, {kBatch}, gen, at::kLong);
  at::Tensor images = patterns.index_select(0, cls) + 0.3 * at::randn({kBatch, 3, 8, 8}, gen);
  return {images, captions.index_select(0, cls)};
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  auto world = hp::init_distributed();
  if (world->size() != 3) {
    std::fprintf(stderr, "vision_llm runs on 3 ranks (hprun --nproc-per-node 3), got %d\n", world->size());
    return 2;
  }
  // The stage-to-mesh map: stage 0 on rank 0, stage 1 on ranks 1 and 2 as (dp=1, tp=2).
  const hp::MeshShape encoder_mesh({1}, {"dp"}, {0});
  const hp::MeshShape decoder_mesh({1, 2}, {"dp", "tp"}, {1, 2});
  const bool encoder = world->rank() == 0;
  hp::DeviceMesh mesh("cpu", encoder ? encoder_mesh : decoder_mesh);

  hp::nn::VisionConfig vc;
  vc.image = 8, vc.channels = 3, vc.patch = 4, vc.out_dim = 32;
  vc.blocks.dim = 32, vc.blocks.layers = 2, vc.blocks.heads = 4, vc.blocks.kv_heads = 2, vc.blocks.ffn_dim = 64;
  hp::nn::LlamaConfig lc;
  lc.vocab = kVocab, lc.dim = 32, lc.layers = 2, lc.heads = 4, lc.kv_heads = 2, lc.ffn_dim = 64, lc.max_seq = 32;

  std::unique_ptr<hp::nn::VisionEncoder> enc;
  std::unique_ptr<hp::nn::Llama> dec;
  hp::pipeline::MeshStageOptions o;
  o.num_stages = 2;
  o.group = world->world_group();
  hp::manual_seed(encoder ? 1 : 2);
  if (encoder) {
    enc = std::make_unique<hp::nn::VisionEncoder>(vc, mesh);
    o.stage_index = 0;
    o.input_placements = {hp::Replicate()};
    o.forward = [&](const hp::DTensor& images) { return (*enc)(images); };
    o.parameters = enc->parameters();
  } else {
    dec = std::make_unique<hp::nn::Llama>(lc, mesh);
    hp::parallelize_llama(*dec, mesh["tp"]);  // the model code holds no parallelism
    o.stage_index = 1;
    o.input_placements = {hp::Replicate(), hp::Replicate()};  // image tokens whole on both tp ranks
    o.forward = [](const hp::DTensor& image_tokens) { return image_tokens; };
    o.loss = [&](const hp::DTensor& image_tokens, const at::Tensor& tokens) {
      return hp::nn::image_text_loss(*dec, image_tokens,
                                     hp::distribute_tensor(tokens, mesh, {hp::Replicate(), hp::Replicate()}));
    };
    o.parameters = dec->parameters();
  }
  std::vector<hp::DTensor*> params = encoder ? enc->parameters() : dec->parameters();
  hp::optim::AdamWOptions adamw;
  adamw.lr = 3e-3;
  hp::optim::AdamW opt(params, adamw);
  hp::pipeline::PipelineRuntime rt({hp::pipeline::mesh_stage(mesh, o)},
                                   hp::schedule::make_schedule("1f1b", 2, kMicrobatches),
                                   {encoder_mesh, decoder_mesh});
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    Batch b = synthetic_batch(step);
    last = rt.step(encoder ? b.images : at::Tensor(), encoder ? at::Tensor() : b.tokens).item<double>();
    if (step == 0) first = last;
    opt.step();
    opt.zero_grad();
    if (world->rank() == 0 && (step % 5 == 0 || step + 1 == steps))
      std::printf("step %d loss %.4f\n", step, last);
  }
  if (world->rank() == 0) std::printf("loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
