#include "hp/checkpoint/hf.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "hp/base/error.h"
#include "hp/checkpoint/dtype.h"
#include "hp/checkpoint/format.h"
#include "hp/checkpoint/load.h"
#include "hp/checkpoint/state.h"
#include "hp/nn/transformer.h"

namespace hp::checkpoint {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// (hp, Hugging Face) name pieces; "#" stands for the layer index.
const std::pair<const char*, const char*> kNames[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"layers.#.attn_norm.weight", "model.layers.#.input_layernorm.weight"},
    {"layers.#.mlp_norm.weight", "model.layers.#.post_attention_layernorm.weight"},
    {"layers.#.attn.q_proj.weight", "model.layers.#.self_attn.q_proj.weight"},
    {"layers.#.attn.k_proj.weight", "model.layers.#.self_attn.k_proj.weight"},
    {"layers.#.attn.v_proj.weight", "model.layers.#.self_attn.v_proj.weight"},
    {"layers.#.attn.o_proj.weight", "model.layers.#.self_attn.o_proj.weight"},
    {"layers.#.mlp.gate_proj.weight", "model.layers.#.mlp.gate_proj.weight"},
    {"layers.#.mlp.up_proj.weight", "model.layers.#.mlp.up_proj.weight"},
    {"layers.#.mlp.down_proj.weight", "model.layers.#.mlp.down_proj.weight"},
};

std::optional<std::string> translate(const std::string& name, bool to_hf) {
  static const std::regex layer(R"(\.(\d+)\.)");
  std::smatch m;
  std::string index, pattern = name;
  if (std::regex_search(name, m, layer)) {
    index = m[1];
    pattern = m.prefix().str() + ".#." + m.suffix().str();
  }
  for (const auto& [hp, hf] : kNames) {
    if (pattern != (to_hf ? hp : hf)) continue;
    std::string out = to_hf ? hf : hp;
    if (auto at = out.find('#'); at != std::string::npos) out.replace(at, 1, index);
    return out;
  }
  return std::nullopt;
}

// One chunk per tensor (the whole of it), named in hp terms, no checksums.
Metadata hf_metadata(const std::string& dir) {
  Metadata m;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model", 0) == 0 && e.path().extension() == ".safetensors") files.push_back(n);
  }
  HP_CHECK(!files.empty()) << dir << ": no model*.safetensors file";
  for (const auto& file : files) {
    const std::string path = dir + "/" + file;
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    HP_CHECK(in) << "cannot open " << path;
    const int64_t file_bytes = static_cast<int64_t>(in.tellg());
    in.seekg(0);
    uint8_t len[8] = {};
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int k = 7; k >= 0; --k) n = (n << 8) | len[k];
    HP_CHECK(in && n <= static_cast<uint64_t>(file_bytes - 8)) << path << ": not a safetensors file (header length "
                                                                << n << ", file " << file_bytes << " bytes)";
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    HP_CHECK(in) << path << ": truncated safetensors header";
    for (auto& e : parse_safetensors_header(header, 8 + static_cast<int64_t>(n), file_bytes, path)) {
      auto name = hp_name_from_hf(e.name);
      if (!name) continue;  // buffers such as rotary_emb.inv_freq
      const std::vector<int64_t> origin(e.shape.size(), 0);
      m.tensors["model." + *name] = TensorMeta{e.dtype, e.shape, {{origin, e.shape, file, e.begin, e.end, {}}}};
    }
  }
  return m;
}

}  // namespace

std::optional<std::string> hf_name(const std::string& hp_name) { return translate(hp_name, true); }
std::optional<std::string> hp_name_from_hf(const std::string& hf_name) { return translate(hf_name, false); }

nn::LlamaConfig read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  nn::LlamaConfig c;
  try {
    json j = json::parse(read_file(path));
    c.vocab = j.at("vocab_size");
    c.dim = j.at("hidden_size");
    c.layers = j.at("num_hidden_layers");
    c.heads = j.at("num_attention_heads");
    c.kv_heads = j.value("num_key_value_heads", c.heads);
    c.ffn_dim = j.at("intermediate_size");
    c.max_seq = j.value("max_position_embeddings", c.max_seq);
    // transformers 5 writes rope_parameters {rope_type, rope_theta}; 4.x rope_theta and rope_scaling.
    const json rope = j.value("rope_parameters", json::object());
    HP_CHECK(rope.value("rope_type", std::string("default")) == "default")
        << path << ": rope_type " << rope.at("rope_type") << ", only the default rotary embedding is supported";
    c.rope_theta = rope.value("rope_theta", j.value("rope_theta", 10000.0));
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    c.norm_eps = j.value("rms_norm_eps", c.norm_eps);
    HP_CHECK(j.value("hidden_act", std::string("silu")) == "silu")
        << path << ": hidden_act " << j.value("hidden_act", std::string()) << ", only silu (SwiGLU) is supported";
    HP_CHECK(j.value("head_dim", c.dim / c.heads) == c.dim / c.heads)
        << path << ": head_dim " << j.at("head_dim") << " differs from hidden_size / num_attention_heads";
    HP_CHECK(j.value("rope_scaling", json()).is_null()) << path << ": rope_scaling is not supported";
  } catch (const json::exception& e) {
    HP_FAIL() << path << ": " << e.what();
  }
  c.validate();
  return c;
}

std::string hf_dtype_name(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return "bfloat16";
  if (dtype == at::kHalf) return "float16";
  HP_CHECK(dtype == at::kFloat) << "Hugging Face export: dtype " << dtype << ", expected float32, bfloat16 or float16";
  return "float32";
}

at::ScalarType hf_dtype_from_name(const std::string& name) {
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf})
    if (hf_dtype_name(t) == name) return t;
  HP_FAIL() << "dtype " << name << ": expected float32, bfloat16 or float16";
  return at::kFloat;
}

void load_hf(const std::string& dir, nn::Llama& model) {
  State state;
  state.add_module(model);
  load_from(hf_metadata(dir), dir, state, /*convert=*/true);
}

void export_hf(const std::string& ckpt_dir, const nn::LlamaConfig& c, const std::string& out_dir,
               at::ScalarType dtype) {
  const Metadata m = read_metadata(ckpt_dir);
  std::vector<std::string> keys, dtypes;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> bytes;
  std::vector<at::Tensor> data;
  for (const auto& [name, t] : m.tensors) {
    if (name.rfind("model.", 0) != 0) continue;
    auto hf = hf_name(name.substr(6));
    HP_CHECK(hf) << ckpt_dir << ": tensor " << name << " has no Hugging Face Llama name";
    data.push_back(read_tensor(ckpt_dir, name).to(dtype).contiguous());
    keys.push_back(*hf);
    dtypes.push_back(dtype_name(dtype));
    shapes.push_back(t.shape);
    bytes.push_back(static_cast<int64_t>(data.back().nbytes()));
  }
  HP_CHECK(!keys.empty()) << ckpt_dir << ": no model parameters (tensors named model.*)";
  fs::create_directories(out_dir);
  std::string file = safetensors_header(keys, dtypes, shapes, bytes);
  for (const auto& t : data) file.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  write_file_synced(out_dir + "/model.safetensors", file);
  const std::string torch_dtype = hf_dtype_name(dtype);
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", c.vocab},
            {"hidden_size", c.dim},
            {"num_hidden_layers", c.layers},
            {"num_attention_heads", c.heads},
            {"num_key_value_heads", c.kv_heads},
            {"intermediate_size", c.ffn_dim},
            {"max_position_embeddings", c.max_seq},
            {"rope_theta", c.rope_theta},  // transformers 4.x
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},  // 5.x
            {"rms_norm_eps", c.norm_eps},
            {"tie_word_embeddings", c.tied_embeddings},
            {"hidden_act", "silu"},
            {"head_dim", c.head_dim()},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"torch_dtype", torch_dtype},  // transformers 4.x
            {"dtype", torch_dtype}};       // 5.x
  write_file_synced(out_dir + "/config.json", j.dump(2) + "\n");
}

}  // namespace hp::checkpoint
