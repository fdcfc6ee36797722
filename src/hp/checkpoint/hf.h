// Hugging Face Llama checkpoints: config.json plus model*.safetensors with names such as
// model.layers.0.self_attn.q_proj.weight. Our rotary embedding rotates dim i with dim
// i + head_dim/2 (rotate-half) at frequency theta^(-2i/head_dim), exactly as Hugging
// Face's Llama does, so q_proj and k_proj load as they are: the permutation that turns
// Meta's interleaved-pair weights into this layout is already in Hugging Face's files.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "hp/nn/llama_config.h"

namespace hp::nn {
class Llama;
}

namespace hp::checkpoint {

// hp name ("layers.0.attn.q_proj.weight") <-> Hugging Face name; none when it has no match.
std::optional<std::string> hf_name(const std::string& hp_name);
std::optional<std::string> hp_name_from_hf(const std::string& hf_name);

nn::LlamaConfig read_hf_config(const std::string& dir);  // dir/config.json

// Loads the weights in `dir` into `model`, each rank reading only its piece of each
// tensor (bfloat16 or float16 files are converted to the model's dtype).
void load_hf(const std::string& dir, nn::Llama& model);

// The dtype names of Hugging Face's config.json: "float32", "bfloat16", "float16".
std::string hf_dtype_name(at::ScalarType dtype);
at::ScalarType hf_dtype_from_name(const std::string& name);  // error if unknown

// Writes the parameters of the hp checkpoint `ckpt_dir` (saved with prefix "model.") as
// out_dir/config.json + out_dir/model.safetensors in `dtype`. One process.
void export_hf(const std::string& ckpt_dir, const nn::LlamaConfig& config, const std::string& out_dir,
               at::ScalarType dtype = at::kFloat);

}  // namespace hp::checkpoint
