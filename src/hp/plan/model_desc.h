// What the planner needs to know about a model: shapes only, no weights.
// Llama-style dense transformers and MoE transformers (routed + shared experts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hp::plan {

struct ModelDesc {
  std::string name;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t ffn = 0;       // SwiGLU inner size of dense layers
  int64_t vocab = 0;
  int64_t seq_len = 0;
  bool tied_embeddings = false;
  // MoE: 0 experts means dense. The first `dense_layers` layers keep a dense FFN.
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t moe_ffn = 0;
  int64_t shared_experts = 0;
  int64_t dense_layers = 0;

  bool is_moe() const { return experts > 0; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
  int64_t q_dim() const { return heads * head_size(); }
  int64_t kv_dim() const { return kv_heads * head_size(); }
  int64_t moe_layers() const { return is_moe() ? layers - dense_layers : 0; }
  bool layer_is_moe(int64_t i) const { return is_moe() && i >= dense_layers; }

  void validate() const;  // throws naming the bad field
};

// Parameter counts (elements). Norm weights are counted with their layer.
struct ParamCounts {
  int64_t attention = 0;      // per layer: q, k, v, o projections + two norms
  int64_t dense_mlp = 0;      // per dense layer
  int64_t moe_shared = 0;     // per MoE layer: router + shared experts
  int64_t moe_expert = 0;     // one routed expert
  int64_t embedding = 0;      // input embedding
  int64_t head = 0;           // output projection + final norm (only the norm when tied)
  int64_t total = 0;
  int64_t active = 0;         // used by one token (top_k experts), embedding lookup included
};
ParamCounts count_params(const ModelDesc& m);

// Presets: tiny, llama3-8b, llama3-70b, llama3-405b, deepseek-v3-like.
std::vector<std::string> model_preset_names();
ModelDesc model_preset(const std::string& name);  // throws listing the presets
// A preset name, or a TOML file whose keys are the ModelDesc field names.
ModelDesc load_model(const std::string& name_or_path);
ModelDesc parse_model_toml(const std::string& text, const std::string& origin);

}  // namespace hp::plan
