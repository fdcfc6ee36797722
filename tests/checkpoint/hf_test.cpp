// Hugging Face Llama layout: our rotary embedding is Hugging Face's formula; a checkpoint
// exported to config.json + model.safetensors loads back into a tensor-parallel Llama
// (sharded as it loads) with every parameter equal, in float32 and in bfloat16.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "hp/checkpoint.h"
#include "hp/parallel.h"
#include "fixtures.h"

using namespace hp;
using namespace hp::checkpoint;

namespace {

nn::LlamaConfig tiny() {
  nn::LlamaConfig c;
  c.vocab = 40, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 24, c.max_seq = 8;
  c.rope_theta = 500000;
  return c;
}

// Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb, written out on full tensors.
at::Tensor hf_rotary(const at::Tensor& x, double theta) {
  const int64_t d = x.size(-1), s = x.size(2);
  at::Tensor inv_freq = 1.0 / at::pow(theta, at::arange(0, d, 2, at::kDouble) / double(d));
  at::Tensor freqs = at::outer(at::arange(s, at::kDouble), inv_freq);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
  at::Tensor rotate_half = at::cat({-x2, x1}, -1);
  return x * emb.cos() + rotate_half * emb.sin();
}

}  // namespace

TEST(HuggingFace, RotaryIsHuggingFacesSoQkWeightsNeedNoPermutation) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1});
    at::Tensor x = at::randn({2, 3, 5, 8}, at::kDouble);
    DTensor y = nn::apply_rotary(distribute_tensor(x, mesh, {Replicate()}), 500000);
    EXPECT_TRUE(at::allclose(y.to_local(), hf_rotary(x, 500000), 1e-12, 1e-12));
  });
}

TEST(HuggingFace, NamesMapBothWays) {
  EXPECT_EQ(hf_name("layers.11.attn.q_proj.weight"), "model.layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(hf_name("layers.0.mlp_norm.weight"), "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(hf_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(hp_name_from_hf("model.embed_tokens.weight"), "tok_embeddings.weight");
  EXPECT_EQ(hp_name_from_hf("model.layers.3.mlp.down_proj.weight"), "layers.3.mlp.down_proj.weight");
  EXPECT_FALSE(hp_name_from_hf("model.layers.0.self_attn.rotary_emb.inv_freq").has_value());
}

TEST(HuggingFace, ExportThenLoadIntoTensorParallelLlama) {
  const auto root = hp::testing::fresh_dir("hf");
  std::map<std::string, at::Tensor> original;
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1});
    manual_seed(3);
    nn::Llama model(tiny(), mesh);
    State s;
    s.add_module(model);
    Checkpointer(CheckpointOptions{root}).save(1, s);
    for (auto& [name, p] : model.named_parameters()) original[name] = p->to_local().detach().clone();
  });
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const std::string out = root + "/hf-" + dtype_name(dtype);
    export_hf(step_dir(root, 1), tiny(), out, dtype);
    auto j = nlohmann::json::parse(read_file(out + "/config.json"));
    EXPECT_EQ(j.at("num_key_value_heads"), 2);
    EXPECT_EQ(j.at("model_type"), "llama");
    const std::string st = read_file(out + "/model.safetensors");
    EXPECT_NE(st.find("\"model.layers.1.self_attn.k_proj.weight\""), std::string::npos);
    EXPECT_NE(st.find("\"lm_head.weight\""), std::string::npos);

    nn::LlamaConfig c = read_hf_config(out);
    EXPECT_EQ(c.dim, 16);
    EXPECT_EQ(c.kv_heads, 2);
    EXPECT_EQ(c.rope_theta, 500000);
    std::map<std::string, at::Tensor> loaded;
    std::vector<std::map<std::string, at::Tensor>> per_rank(2);
    comm::run_local_ranks(2, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
      manual_seed(77);
      nn::Llama model(c, mesh);
      parallelize_llama(model, mesh, {false, true});
      load_hf(out, model);
      for (auto& [name, p] : model.named_parameters()) per_rank[rank][name] = p->full_tensor();
    });
    loaded = hp::testing::same_on_every_rank(per_rank);
    ASSERT_EQ(loaded.size(), original.size());
    for (const auto& [name, t] : original)
      EXPECT_TRUE(at::equal(loaded.at(name), t.to(dtype).to(at::kFloat))) << name << " " << dtype_name(dtype);
  }
}
