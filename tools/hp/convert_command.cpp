// hp convert: Hugging Face Llama checkpoints to and from hp checkpoints.
//   hp convert --to-hf CKPT --config FILE.toml --out DIR [--dtype bfloat16]
//   hp convert --from-hf DIR --out ROOT        (writes ROOT/step-00000000 and ROOT/model.toml)
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "hp/checkpoint.h"
#include "hp/comm/local_ranks.h"
#include "hp/nn/transformer.h"
#include "hp/train.h"

namespace hp::cli {
namespace {

// A checkpoint root (the latest published step under it) or a step directory itself.
std::string step_directory(const std::string& path) {
  if (std::ifstream(path + "/metadata.json")) return path;
  auto step = checkpoint::latest_step(path);
  HP_CHECK(step) << path << ": neither a checkpoint (no metadata.json) nor a root holding published ones";
  return checkpoint::published_dir(path, *step);
}

void from_hf(const std::string& hf_dir, const std::string& root) {
  const nn::LlamaConfig c = checkpoint::read_hf_config(hf_dir);
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1});
    nn::Llama model(c, mesh);
    checkpoint::load_hf(hf_dir, model);
    checkpoint::State state;
    state.add_module(model);
    checkpoint::Checkpointer(checkpoint::CheckpointOptions{root, /*keep=*/0}).save(0, state);
  });
  train::TrainConfig t = train::default_config();
  t.model = c;
  const std::string text = t.to_string();
  const auto begin = text.find("[model]"), end = text.find("\n\n", begin);
  std::ofstream(root + "/model.toml") << text.substr(begin, end - begin) << "\n";
  std::cout << "wrote " << checkpoint::step_dir(root, 0) << " and " << root << "/model.toml (its [model] section)\n";
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "convert Hugging Face Llama checkpoints to and from hp checkpoints");
  struct Args {
    std::string to_hf, from_hf, config, out, dtype = "float32";
  };
  auto a = std::make_shared<Args>();
  auto* to = cmd->add_option("--to-hf", a->to_hf, "hp checkpoint (a step directory, or a root: its latest)");
  auto* from = cmd->add_option("--from-hf", a->from_hf, "Hugging Face directory (config.json, model*.safetensors)");
  to->excludes(from);
  cmd->add_option("--config", a->config, "with --to-hf: the training TOML whose [model] the checkpoint holds");
  cmd->add_option("--out", a->out, "output directory")->required();
  cmd->add_option("--dtype", a->dtype, "with --to-hf: float32 (default), bfloat16 or float16");
  cmd->callback([a] {
    HP_CHECK(!a->to_hf.empty() || !a->from_hf.empty()) << "hp convert: give --to-hf CKPT or --from-hf DIR";
    if (!a->from_hf.empty()) return from_hf(a->from_hf, a->out);
    HP_CHECK(!a->config.empty()) << "hp convert --to-hf: --config FILE.toml is needed (the model's shape)";
    const std::string dir = step_directory(a->to_hf);
    checkpoint::export_hf(dir, train::load_config(a->config).model, a->out, checkpoint::hf_dtype_from_name(a->dtype));
    std::cout << "wrote " << a->out << "/config.json and " << a->out << "/model.safetensors from " << dir << "\n";
  });
}

}  // namespace hp::cli
