// MPMD pipelines: a vision encoder stage and a Llama decoder stage on meshes of different
// sizes and layouts (1 rank + tp=2, 1 rank + dp=2, dp=2 with fully_shard + tp=2), under
// GPipe and 1F1B (and ZB-H1's split backwards where no fully_shard is involved) with 1 to
// 4 microbatches, against the single-process model on the same numbers: the loss of two
// steps, every gradient of the first step and every parameter after two AdamW steps.
// float32; relative 1e-5 with an absolute floor of 1e-6 for values near zero.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "hp/comm.h"
#include "hp/optim/adamw.h"
#include "hp/parallel.h"
#include "hp/pipeline.h"
#include "hp/schedule.h"

using namespace hp;

namespace {

constexpr double kRtol = 1e-5, kAtol = 1e-6;
constexpr int64_t kBatch = 12, kText = 6;  // rows split into 1..4 microbatches; text tokens per row
constexpr int kSteps = 2;
constexpr uint64_t kEncoderSeed = 1, kDecoderSeed = 2;

nn::VisionConfig vision_config() {
  nn::VisionConfig c;
  c.image = 8, c.channels = 3, c.patch = 4, c.out_dim = 16;
  c.blocks.dim = 16, c.blocks.layers = 1, c.blocks.heads = 4, c.blocks.kv_heads = 2, c.blocks.ffn_dim = 24;
  return c;
}

nn::LlamaConfig decoder_config() {
  nn::LlamaConfig c;
  c.vocab = 32, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 24, c.max_seq = 16;
  return c;
}

struct Data {
  std::vector<at::Tensor> images, tokens;  // per step: [kBatch, 3, 8, 8] and [kBatch, kText + 1]
};

const Data& data() {
  static Data d = [] {
    Data d;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
    for (int s = 0; s < kSteps; ++s) {
      d.images.push_back(at::randn({kBatch, 3, 8, 8}, gen, at::kFloat));
      d.tokens.push_back(at::randint(decoder_config().vocab, {kBatch, kText + 1}, gen, at::kLong));
    }
    return d;
  }();
  return d;
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> first_grads, final_params;  // "encoder.*", "decoder.*"
};

std::unique_ptr<optim::AdamW> adamw(std::vector<DTensor*> params) {
  optim::AdamWOptions o;
  o.lr = 1e-2, o.weight_decay = 0.1;
  return std::make_unique<optim::AdamW>(std::move(params), o);
}

// One process: loss = mean over the m microbatches of their losses, as the pipeline has it.
const RunResult& reference(int m) {
  static std::map<int, RunResult> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.count(m)) return cache[m];
  RunResult out;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(kEncoderSeed);
    nn::VisionEncoder enc(vision_config(), mesh);
    manual_seed(kDecoderSeed);
    nn::Llama dec(decoder_config(), mesh);
    std::vector<DTensor*> params = enc.parameters();
    for (DTensor* p : dec.parameters()) params.push_back(p);
    auto opt = adamw(params);
    const std::vector<Placement> r{Replicate()};
    for (int step = 0; step < kSteps; ++step) {
      auto images = data().images[step].split(kBatch / m), tokens = data().tokens[step].split(kBatch / m);
      at::Tensor loss = at::zeros({}, at::kFloat);
      for (int i = 0; i < m; ++i) {
        DTensor img = enc(distribute_tensor(images[i], mesh, r));
        loss = loss + nn::image_text_loss(dec, img, distribute_tensor(tokens[i], mesh, r)).to_local();
      }
      loss = loss / double(m);
      loss.backward();
      out.losses.push_back(loss.item<double>());
      if (step == 0) {
        for (auto& [n, p] : enc.named_parameters()) out.first_grads["encoder." + n] = p->grad()->full_tensor();
        for (auto& [n, p] : dec.named_parameters()) out.first_grads["decoder." + n] = p->grad()->full_tensor();
      }
      opt->step();
      opt->zero_grad();
    }
    for (auto& [n, p] : enc.named_parameters()) out.final_params["encoder." + n] = p->full_tensor();
    for (auto& [n, p] : dec.named_parameters()) out.final_params["decoder." + n] = p->full_tensor();
  });
  return cache[m] = out;
}

// Where each stage runs and how its parallelism is laid out.
struct Layout {
  std::string name;
  std::vector<int64_t> enc_dims;
  std::vector<std::string> enc_names;
  std::vector<Placement> enc_input;
  bool enc_fully_shard = false;
  std::vector<int64_t> dec_dims;  // always named (dp, tp)
  std::vector<Placement> dec_input;
  int world() const {
    int64_t e = 1, d = 1;
    for (int64_t k : enc_dims) e *= k;
    for (int64_t k : dec_dims) d *= k;
    return static_cast<int>(e + d);
  }
};

std::vector<Layout> layouts() {
  return {
      {"one_rank_then_tp2", {1}, {"dp"}, {Replicate()}, false, {1, 2}, {Replicate(), Replicate()}},
      {"one_rank_then_dp2", {1}, {"dp"}, {Replicate()}, false, {2, 1}, {Shard(0), Replicate()}},
      {"fsdp2_then_tp2", {2}, {"dp"}, {Shard(0)}, true, {1, 2}, {Replicate(), Replicate()}},
  };
}

MeshShape mesh_shape(const std::vector<int64_t>& dims, const std::vector<std::string>& names, int first) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(first + r);
  return MeshShape(dims, names, ranks);
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, kRtol, kAtol)) << what << ": max abs diff " << (got - want).abs().max().item<double>();
}

// This rank's model (encoder or decoder, parallelized as the layout says) and its stage.
struct Built {
  std::unique_ptr<nn::VisionEncoder> enc;
  std::unique_ptr<nn::Llama> dec;
  pipeline::MeshStageOptions options;
  nn::Module& model() { return enc ? static_cast<nn::Module&>(*enc) : static_cast<nn::Module&>(*dec); }
  std::string prefix() const { return enc ? "encoder." : "decoder."; }
};

Built build_stage(const Layout& L, const DeviceMesh& mesh, bool encoder, std::shared_ptr<const comm::Group> group) {
  Built b;
  pipeline::MeshStageOptions& o = b.options;
  o.num_stages = 2;
  o.group = std::move(group);
  if (encoder) {
    manual_seed(kEncoderSeed);
    b.enc = std::make_unique<nn::VisionEncoder>(vision_config(), mesh);
    if (L.enc_fully_shard) {
      for (auto& [n, mod] : b.enc->named_modules())
        if (name_matches("layers.*", n)) fully_shard(*mod, mesh);
      FSDPModule root = fully_shard(*b.enc, mesh);
      o.set_requires_gradient_sync = [root](bool on) mutable { root.set_requires_gradient_sync(on); };
    }
    o.stage_index = 0;
    o.input_placements = L.enc_input;
    o.forward = [enc = b.enc.get()](const DTensor& images) { return (*enc)(images); };
    o.parameters = b.enc->parameters();
  } else {
    manual_seed(kDecoderSeed);
    b.dec = std::make_unique<nn::Llama>(decoder_config(), mesh);
    if (mesh.size(1) > 1) parallelize_llama(*b.dec, mesh["tp"]);
    o.stage_index = 1;
    o.input_placements = L.dec_input;
    o.forward = [](const DTensor& image_tokens) { return image_tokens; };
    o.loss = [dec = b.dec.get(), mesh, placements = L.dec_input](const DTensor& image_tokens,
                                                                 const at::Tensor& tokens) {
      return nn::image_text_loss(*dec, image_tokens, distribute_tensor(tokens, mesh, placements));
    };
    o.parameters = b.dec->parameters();
  }
  return b;
}

struct Case {
  Layout layout;
  std::string kind;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.layout.name << " " << c.kind; }

class MpmdMatchesReference : public testing::TestWithParam<Case> {};

TEST_P(MpmdMatchesReference, LossGradsAndParamsEqualSingleProcess) {
  const Layout& L = GetParam().layout;
  const std::string kind = GetParam().kind;
  for (int m = 1; m <= 4; ++m) reference(m);  // outside the ranks' threads
  const MeshShape enc_shape = mesh_shape(L.enc_dims, L.enc_names, 0);
  const MeshShape dec_shape = mesh_shape(L.dec_dims, {"dp", "tp"}, static_cast<int>(enc_shape.size()));

  comm::run_local_ranks(L.world(), [&](int rank) {
    auto group = comm::current_world()->world_group();
    const bool encoder = enc_shape.contains(rank);
    DeviceMesh mesh("cpu", encoder ? enc_shape : dec_shape);
    for (int m = 1; m <= 4; ++m) {
      const RunResult& ref = reference(m);
      const std::string where = L.name + " " + kind + " m=" + std::to_string(m) + " rank " + std::to_string(rank);
      auto sched = schedule::make_schedule(kind, 2, m);
      Built b = build_stage(L, mesh, encoder, group);
      nn::Module& model = b.model();
      const std::string prefix = b.prefix();
      auto opt = adamw(model.parameters());
      pipeline::PipelineRuntime rt({pipeline::mesh_stage(mesh, b.options)}, sched, {enc_shape, dec_shape});
      for (int step = 0; step < kSteps; ++step) {
        double loss = rt.step(encoder ? data().images[step] : at::Tensor(),
                              encoder ? at::Tensor() : data().tokens[step]).item<double>();
        EXPECT_NEAR(loss, ref.losses[step], kRtol * std::abs(ref.losses[step])) << where << " step " << step;
        if (step == 0)
          for (auto& [n, p] : model.named_parameters()) {
            ASSERT_TRUE(p->grad().has_value()) << where << ": no gradient for " << prefix + n;
            expect_close(p->grad()->full_tensor(), ref.first_grads.at(prefix + n), where + " gradient of " + prefix + n);
          }
        opt->step();
        opt->zero_grad();
      }
      for (auto& [n, p] : model.named_parameters())
        expect_close(p->full_tensor(), ref.final_params.at(prefix + n), where + " parameter " + prefix + n);
    }
  });
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Layout& l : layouts()) {
    for (std::string k : {"gpipe", "1f1b"}) out.push_back({l, k});
    // Split backwards (I then W) too, where no fully_shard needs whole backwards.
    if (!l.enc_fully_shard) out.push_back({l, "zb-h1"});
  }
  return out;
}

// Microbatches whose shapes differ: images of 8, 4 and 12 pixels (4, 1 and 9 image tokens
// cross between the stages) with captions of 6, 3 and 5 tokens, in one step.
class MpmdVariableShapes : public testing::TestWithParam<Case> {};

TEST_P(MpmdVariableShapes, ImageTokenCountChangesPerMicrobatch) {
  const Layout& L = GetParam().layout;
  const std::string kind = GetParam().kind;
  const std::vector<int64_t> sizes{8, 4, 12}, texts{6, 3, 5};
  const int m = static_cast<int>(sizes.size());
  std::vector<at::Tensor> images, tokens;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  for (int i = 0; i < m; ++i) {
    images.push_back(at::randn({4, 3, sizes[i], sizes[i]}, gen, at::kFloat));
    tokens.push_back(at::randint(decoder_config().vocab, {4, texts[i] + 1}, gen, at::kLong));
  }
  double ref_loss = 0;
  std::map<std::string, at::Tensor> ref_grads;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(kEncoderSeed);
    nn::VisionEncoder enc(vision_config(), mesh);
    manual_seed(kDecoderSeed);
    nn::Llama dec(decoder_config(), mesh);
    const std::vector<Placement> r{Replicate()};
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (int i = 0; i < m; ++i)
      loss = loss + nn::image_text_loss(dec, enc(distribute_tensor(images[i], mesh, r)),
                                        distribute_tensor(tokens[i], mesh, r)).to_local();
    loss = loss / double(m);
    loss.backward();
    ref_loss = loss.item<double>();
    for (auto& [n, p] : enc.named_parameters()) ref_grads["encoder." + n] = p->grad()->full_tensor();
    for (auto& [n, p] : dec.named_parameters()) ref_grads["decoder." + n] = p->grad()->full_tensor();
  });

  const MeshShape enc_shape = mesh_shape(L.enc_dims, L.enc_names, 0);
  const MeshShape dec_shape = mesh_shape(L.dec_dims, {"dp", "tp"}, static_cast<int>(enc_shape.size()));
  comm::run_local_ranks(L.world(), [&](int rank) {
    const bool encoder = enc_shape.contains(rank);
    DeviceMesh mesh("cpu", encoder ? enc_shape : dec_shape);
    Built b = build_stage(L, mesh, encoder, comm::current_world()->world_group());
    pipeline::PipelineRuntime rt({pipeline::mesh_stage(mesh, b.options)}, schedule::make_schedule(kind, 2, m),
                                 {enc_shape, dec_shape});
    const std::string where = L.name + " " + kind + " rank " + std::to_string(rank);
    double loss = rt.step(encoder ? images : std::vector<at::Tensor>{},
                          encoder ? std::vector<at::Tensor>{} : tokens).item<double>();
    EXPECT_NEAR(loss, ref_loss, kRtol * std::abs(ref_loss)) << where;
    for (auto& [n, p] : b.model().named_parameters())
      expect_close(p->grad()->full_tensor(), ref_grads.at(b.prefix() + n), where + " gradient of " + b.prefix() + n);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, MpmdVariableShapes, testing::ValuesIn(std::vector<Case>{
                             {layouts()[0], "1f1b"}, {layouts()[1], "gpipe"}, {layouts()[2], "1f1b"}}),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.layout.name; });

INSTANTIATE_TEST_SUITE_P(Layouts, MpmdMatchesReference, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& i) {
                           std::string k = i.param.kind == "1f1b" ? "one_f_one_b" : i.param.kind;
                           std::replace(k.begin(), k.end(), '-', '_');
                           return i.param.layout.name + "_" + k;
                         });

}  // namespace

namespace {

// A plain one-tensor stage: enough for the runtime's checks of the stage-to-mesh map.
pipeline::PipelineStage plain_stage(int s, std::shared_ptr<const comm::Group> group) {
  pipeline::PipelineStage st;
  st.stage_index = s;
  st.num_stages = 2;
  st.parameters = {at::full({}, 2.0).requires_grad_(true)};
  st.forward = [w = st.parameters[0]](const at::Tensor& x) { return x * w; };
  if (s == 1) st.loss = [](const at::Tensor& y, const at::Tensor&) { return y.sum(); };
  st.group = std::move(group);
  return st;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(MpmdErrors, BadStageToMeshMapsAreNamed) {
  comm::run_local_ranks(3, [&](int rank) {
    auto group = comm::current_world()->world_group();
    const int s = rank == 0 ? 0 : 1;
    auto sched = schedule::make_schedule("1f1b", 2, 2);
    const MeshShape one({1}, {"dp"}, {0}), two({2}, {"tp"}, {1, 2});
    auto make = [&](std::vector<MeshShape> meshes, pipeline::PipelineStage st) {
      return error_of([&] { pipeline::PipelineRuntime({st}, sched, meshes); });
    };
    EXPECT_NE(make({one, MeshShape({2}, {"tp"}, {0, 1})}, plain_stage(s, group)).find("in the meshes of both"),
              std::string::npos);
    EXPECT_NE(make({one, MeshShape({1}, {"tp"}, {1})}, plain_stage(s, group)).find("is in no stage mesh"),
              std::string::npos);
    EXPECT_NE(make({one}, plain_stage(s, group)).find("1 stage meshes were given"), std::string::npos);
    pipeline::PipelineStage wrong = plain_stage(s, group);
    wrong.mesh = MeshShape({3}, {"tp"}, {0, 1, 2});
    EXPECT_NE(make({one, two}, wrong).find("runs on"), std::string::npos);
    pipeline::PipelineStage synced = plain_stage(s, group);
    synced.set_requires_gradient_sync = [](bool) {};
    std::string e = error_of([&] {
      pipeline::PipelineRuntime({synced}, schedule::make_schedule("zb-h1", 2, 2), {one, two});
    });
    EXPECT_NE(e.find("needs full backwards"), std::string::npos) << e;
    // The map itself is fine: one step of the plain stages runs (rank 0 feeds, 1 and 2 compute).
    pipeline::PipelineRuntime rt({plain_stage(s, group)}, sched, {one, two});
    at::Tensor x = at::arange(4, at::kFloat).reshape({2, 2});
    double loss = rt.step(rank == 0 ? x : at::Tensor(), rank == 0 ? at::Tensor() : x).item<double>();
    EXPECT_DOUBLE_EQ(loss, 4 * (0 + 1 + 2 + 3) / 2.0);  // mean over 2 microbatches of sum(4 x)
  });
}
