// hp's Llama against Hugging Face transformers' LlamaForCausalLM (the venv's, float32, eager
// attention, offline) on the same tokens, both ways: an `hp train` checkpoint exported with
// `hp convert --to-hf` and loaded by from_pretrained; a model made and saved by transformers
// converted with `hp convert --from-hf`. hp computes its logits tensor parallel over 2 ranks
// and every rank's full logits are compared: rtol 1e-4, with atol 1e-5 for logits near zero.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <mutex>

#include "fixtures.h"
#include "hp/checkpoint.h"
#include "hp/parallel.h"
#include "tools/shell.h"

using namespace hp;

namespace {

const std::string kPeer = std::string(PYTHON) + " " + PROJECT_DIR "/tests/checkpoint/hf_peer.py ";
const std::string kHp = HP_BIN_DIR "/hp ";

void write_tokens(const at::Tensor& tokens, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  f << tokens.size(0) << " " << tokens.size(1) << "\n";
  f.write(static_cast<const char*>(tokens.data_ptr()), static_cast<std::streamsize>(tokens.nbytes()));
}

at::Tensor read_logits(const std::string& path, const std::vector<int64_t>& shape) {
  at::Tensor t = at::empty(shape, at::kFloat);
  std::ifstream f(path, std::ios::binary);
  f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  EXPECT_TRUE(f && f.peek() == EOF) << path << " does not hold " << t.nbytes() << " bytes";
  return t;
}

// The logits of the hp checkpoint `step_dir` on `tokens`, as each of 2 tensor-parallel
// ranks gathers them.
std::vector<at::Tensor> hp_logits(const nn::LlamaConfig& c, const std::string& step_dir, const at::Tensor& tokens) {
  std::vector<at::Tensor> out(2);
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    nn::Llama model(c, mesh);
    parallelize_llama(model, mesh, {false, /*loss_parallel=*/true});
    checkpoint::State state;
    state.add_module(model);
    checkpoint::load(step_dir, state);
    at::NoGradGuard no_grad;
    out[rank] = model(distribute_tensor(tokens, mesh, {Replicate()})).full_tensor();
  });
  return out;
}

void expect_close(const std::vector<at::Tensor>& got, const at::Tensor& want) {
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].sizes(), want.sizes()) << "rank " << r;
    EXPECT_TRUE(at::allclose(got[r], want, 1e-4, 1e-5))
        << "rank " << r << ": max abs difference " << (got[r] - want).abs().max().item<double>() << " on logits up to "
        << want.abs().max().item<double>();
  }
}

at::Tensor some_tokens(int64_t vocab) {
  at::manual_seed(5);
  return at::randint(vocab, {3, 24}, at::kLong);
}

}  // namespace

TEST(Transformers, HpTrainCheckpointExportedGivesTheSameLogits) {
  const std::string dir = hp::testing::fresh_dir("to_hf");
  const std::string config = dir + "/run.toml";
  std::ofstream(config) << "[mesh]\nshape = [2]\nnames = [\"dp\"]\n"
                           "[model]\ndim = 64\nlayers = 2\nheads = 4\nkv_heads = 2\nffn_dim = 160\nmax_seq = 32\n"
                           "rope_theta = 500000.0\nnorm_eps = 1e-5\n"
                           "[train]\nsteps = 4\nbatch = 4\nseq = 32\nlr = 1e-2\nwarmup = 1\nlog_every = 1\n"
                           "[checkpoint]\ndir = \"" + dir + "/ckpt\"\nevery = 4\n";
  Result train = shell(HP_BIN_DIR "/hprun --nproc-per-node 2 " + kHp + "train --config " + config);
  ASSERT_EQ(train.code, 0) << train.output;
  Result convert = shell(kHp + "convert --to-hf " + dir + "/ckpt --config " + config + " --out " + dir + "/hf");
  ASSERT_EQ(convert.code, 0) << convert.output;

  const nn::LlamaConfig c = checkpoint::read_hf_config(dir + "/hf");
  EXPECT_EQ(c.rope_theta, 500000);
  EXPECT_EQ(c.norm_eps, 1e-5);
  const at::Tensor tokens = some_tokens(c.vocab);
  write_tokens(tokens, dir + "/tokens.bin");
  Result peer = shell(kPeer + "logits " + dir + "/hf " + dir + "/tokens.bin " + dir + "/logits.bin");
  ASSERT_EQ(peer.code, 0) << peer.output;
  expect_close(hp_logits(c, checkpoint::step_dir(dir + "/ckpt", 4), tokens),
               read_logits(dir + "/logits.bin", {tokens.size(0), tokens.size(1), c.vocab}));
}

TEST(Transformers, ModelSavedByTransformersLoadsWithTheSameLogits) {
  const std::string dir = hp::testing::fresh_dir("from_hf");
  const std::string hf_config =
      R"('{"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, )"
      R"("num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 64, )"
      R"("rope_theta": 250000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}')";
  Result make = shell(kPeer + "make " + dir + "/hf " + hf_config + " 0");
  ASSERT_EQ(make.code, 0) << make.output;
  const at::Tensor tokens = some_tokens(300);
  write_tokens(tokens, dir + "/tokens.bin");
  Result peer = shell(kPeer + "logits " + dir + "/hf " + dir + "/tokens.bin " + dir + "/logits.bin");
  ASSERT_EQ(peer.code, 0) << peer.output;

  Result convert = shell(kHp + "convert --from-hf " + dir + "/hf --out " + dir + "/ckpt");
  ASSERT_EQ(convert.code, 0) << convert.output;
  const nn::LlamaConfig c = checkpoint::read_hf_config(dir + "/hf");
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.kv_heads, 2);
  expect_close(hp_logits(c, checkpoint::step_dir(dir + "/ckpt", 0), tokens),
               read_logits(dir + "/logits.bin", {tokens.size(0), 24, 300}));
}
