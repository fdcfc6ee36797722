#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <variant>

#include "hp/base/error.h"
#include "hp/train/config.h"
#include "hp/train/config_fields.h"

using hp::train::TrainConfig;

namespace {

// A file under the test temp dir that is removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/hp_config_test_" + std::to_string(::getpid()) +
            "_" + std::to_string(counter_++) + ".toml";
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::string load_error(const std::string& text, std::string* path = nullptr) {
  TempFile f(text);
  if (path) *path = f.path();
  try {
    hp::train::load_config(f.path());
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(hay, needle) EXPECT_NE((hay).find(needle), std::string::npos) << (hay)

}  // namespace

TEST(TrainConfig, Defaults) {
  auto c = hp::train::default_config();
  EXPECT_EQ(c.mesh.shape, std::vector<int64_t>{1});
  EXPECT_EQ(c.mesh.names, std::vector<std::string>{"dp"});
  EXPECT_FALSE(c.mesh.sequence_parallel);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_EQ(c.model.dim, 128);
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.heads, 4);
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_EQ(c.model.ffn_dim, 384);
  EXPECT_EQ(c.model.max_seq, 128);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 10000.0);
  EXPECT_FALSE(c.model.tied_embeddings);
  EXPECT_EQ(c.train.steps, 200);
  EXPECT_EQ(c.train.batch, 8);
  EXPECT_EQ(c.train.seq, 64);
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-3);
  EXPECT_EQ(c.train.warmup, 10);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.seed, 0u);
  EXPECT_EQ(c.train.log_every, 10);
  EXPECT_FALSE(c.train.deterministic);
  EXPECT_EQ(c.data.path, "");
  EXPECT_EQ(c.checkpoint.dir, "");  // no checkpoints unless asked
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_TRUE(c.checkpoint.async);
  EXPECT_TRUE(c.checkpoint.resume);
  EXPECT_EQ(c.low_precision.scaling, "");  // float32 unless asked
  EXPECT_EQ(c.world_size(), 1);
  EXPECT_NO_THROW(hp::train::validate(c));
}

TEST(TrainConfig, EmptyFileGivesDefaults) {
  TempFile f("# nothing set\n");
  auto c = hp::train::load_config(f.path());
  EXPECT_EQ(c.source, f.path());
  c.source = "<defaults>";
  EXPECT_EQ(c.to_string(), hp::train::default_config().to_string());
}

TEST(TrainConfig, FileOverridesAndRoundTrips) {
  TempFile f(R"(
[mesh]
shape = [2, 2]
names = ["dp", "tp"]
sequence_parallel = true

[model]
dim = 64
heads = 4
kv_heads = 4
rope_theta = 500000      # an integer is fine for a float
tied_embeddings = true

[train]
steps = 7
batch = 6
seq = 32
lr = 0.1
weight_decay = 1e-2
seed = 42
deterministic = true

[data]
path = "some \"quoted\" dir/corpus.txt"

[checkpoint]
dir = "runs/ckpt"
every = 50
keep = 3
async = false
resume = false
)");
  auto c = hp::train::load_config(f.path());
  EXPECT_EQ(c.mesh.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.mesh.names, (std::vector<std::string>{"dp", "tp"}));
  EXPECT_TRUE(c.mesh.sequence_parallel);
  EXPECT_EQ(c.mesh_size("dp"), 2);
  EXPECT_EQ(c.mesh_size("tp"), 2);
  EXPECT_EQ(c.mesh_size("pp"), 1);
  EXPECT_EQ(c.world_size(), 4);
  // Ranks row-major over the trainer's mesh (pp outermost, size 1 here): rank 1 is dp 0, tp 1.
  EXPECT_EQ(c.mesh_coordinate("dp", 1), 0);
  EXPECT_EQ(c.mesh_coordinate("tp", 1), 1);
  EXPECT_EQ(c.mesh_coordinate("dp", 2), 1);
  EXPECT_EQ(c.mesh_coordinate("pp", 3), 0);
  EXPECT_EQ(c.mesh_coordinate("ep", 3), 0);  // no such dim
  EXPECT_EQ(c.model.dim, 64);
  EXPECT_EQ(c.model.kv_heads, 4);
  EXPECT_EQ(c.model.layers, 4);  // untouched default
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 500000.0);
  EXPECT_TRUE(c.model.tied_embeddings);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.batch, 6);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.1);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.01);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_TRUE(c.train.deterministic);
  EXPECT_EQ(c.data.path, "some \"quoted\" dir/corpus.txt");
  EXPECT_EQ(c.checkpoint.dir, "runs/ckpt");
  EXPECT_EQ(c.checkpoint.every, 50);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_FALSE(c.checkpoint.async);
  EXPECT_FALSE(c.checkpoint.resume);

  // to_string is TOML that reads back to the same config.
  TempFile again(c.to_string());
  auto d = hp::train::load_config(again.path());
  d.source = c.source;
  EXPECT_EQ(d.to_string(), c.to_string());
  EXPECT_EQ(d.train.lr, c.train.lr);  // bit-exact floats
  EXPECT_EQ(d.train.weight_decay, c.train.weight_decay);
}

TEST(TrainConfig, ShippedConfigsLoad) {
  auto demo = hp::train::load_config(std::string(HP_SOURCE_DIR) + "/configs/demo.toml");
  EXPECT_EQ(demo.mesh_size("dp"), 2);
  EXPECT_EQ(demo.mesh_size("tp"), 2);
  EXPECT_FALSE(demo.mesh.sequence_parallel);
  EXPECT_EQ(demo.train.steps, 200);
  auto tp4 = hp::train::load_config(std::string(HP_SOURCE_DIR) + "/configs/tp4.toml");
  EXPECT_EQ(tp4.mesh_size("tp"), 4);
  EXPECT_EQ(tp4.world_size(), 4);
}

// Every configs/*.toml the trainer reads loads and validates. *_desc.toml files are model
// descriptions for the planner (hp dryrun --model), not trainer configs.
TEST(TrainConfig, EveryShippedTrainConfigLoads) {
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HP_SOURCE_DIR) + "/configs")) {
    const std::string name = entry.path().filename().string();
    const bool model_description = name.size() > 10 && name.compare(name.size() - 10, 10, "_desc.toml") == 0;
    if (entry.path().extension() != ".toml" || model_description) continue;
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(hp::train::load_config(entry.path().string()));
    ++loaded;
  }
  EXPECT_GE(loaded, 4);  // demo, tp4, bench_3m, pipeline

  auto pipe = hp::train::load_config(std::string(HP_SOURCE_DIR) + "/configs/pipeline.toml");
  EXPECT_EQ(pipe.mesh_size("pp"), 2);
  EXPECT_EQ(pipe.mesh_size("dp"), 2);
  EXPECT_EQ(pipe.pipeline.schedule, "1f1b");
  EXPECT_EQ(pipe.microbatches(), 4);
  EXPECT_EQ(pipe.stages_per_rank(), 1);
}

TEST(TrainConfig, UnknownKeyNamesKeyAndFile) {
  std::string path;
  auto m = load_error("[model]\ndim = 64\ndimm = 3\n", &path);
  EXPECT_HAS(m, "unknown key model.dimm");
  EXPECT_HAS(m, path + ":3");
  EXPECT_HAS(m, "known:");
}

TEST(TrainConfig, UnknownSectionAndTopLevelKey) {
  EXPECT_HAS(load_error("[optimizer]\nlr = 1.0\n"), "unknown key optimizer");
  EXPECT_HAS(load_error("steps = 3\n"), "unknown key steps");
  EXPECT_HAS(load_error("model = 3\n"), "model must be a table");
}

TEST(TrainConfig, ErrorsListWhatTheTableKnows) {
  EXPECT_HAS(load_error("[optimizer]\nlr = 1.0\n"),
             "known sections: [mesh], [pipeline], [model], [moe], [train], [data], [checkpoint], [low_precision], "
             "[memory], [monitor])");
  EXPECT_HAS(load_error("[mesh]\nfoo = 1\n"),
             "unknown key mesh.foo (known: async_tp, context_parallel, cp_load_balance, cp_ulysses_degree, data_parallel, names, sequence_parallel, shape)");
  EXPECT_HAS(load_error("[pipeline]\nstages = 2\n"),
             "unknown key pipeline.stages (known: microbatches, schedule, split, virtual_stages)");
}

TEST(TrainConfig, WrongTypeNamesKeyValueAndFile) {
  std::string path;
  auto m = load_error("[train]\nsteps = \"many\"\n", &path);
  EXPECT_HAS(m, "train.steps must be an integer");
  EXPECT_HAS(m, "many");
  EXPECT_HAS(m, path + ":2");
  EXPECT_HAS(load_error("[train]\nsteps = 2.5\n"), "train.steps must be an integer");
  EXPECT_HAS(load_error("[train]\nlr = \"fast\"\n"), "train.lr must be a number");
  EXPECT_HAS(load_error("[train]\ndeterministic = 1\n"), "train.deterministic must be a boolean");
  EXPECT_HAS(load_error("[train]\nseed = -1\n"), "train.seed must be a non-negative integer");
  EXPECT_HAS(load_error("[mesh]\nshape = [2, \"x\"]\n"), "mesh.shape must be an array of integers");
  EXPECT_HAS(load_error("[mesh]\nnames = \"dp\"\n"), "mesh.names must be an array of strings");
  EXPECT_HAS(load_error("[data]\npath = 3\n"), "data.path must be a string");
  EXPECT_HAS(load_error("[checkpoint]\nasync = \"yes\"\n"), "checkpoint.async must be a boolean");
  EXPECT_HAS(load_error("[checkpoint]\nevery = -1\n"), "checkpoint.every = -1 must be >= 0");
  EXPECT_HAS(load_error("[monitor]\nevery = -1\n"), "monitor.every = -1 must be >= 0");
  EXPECT_HAS(load_error("[monitor]\nspike_factor = 0.5\n"), "monitor.spike_factor = 0.5 must be 0 (off) or above 1");
}

TEST(TrainConfig, MissingFileNamesIt) {
  try {
    hp::train::load_config("/nonexistent/dir/run.toml");
    FAIL() << "no throw";
  } catch (const hp::Error& e) {
    EXPECT_HAS(std::string(e.what()), "/nonexistent/dir/run.toml");
  }
}

TEST(TrainConfig, SyntaxErrorNamesFile) {
  std::string path;
  auto m = load_error("[train\nsteps = 3\n", &path);
  EXPECT_HAS(m, "cannot parse config");
  EXPECT_HAS(m, path);
}

TEST(TrainConfig, InconsistentValuesAreErrors) {
  EXPECT_HAS(load_error("[mesh]\nshape = [2, 2]\nnames = [\"dp\"]\n"), "equal length");
  EXPECT_HAS(load_error("[mesh]\nshape = [2, 2]\nnames = [\"dp\", \"dp\"]\n"), "distinct");
  EXPECT_HAS(load_error("[mesh]\nshape = [0]\n"), "mesh.shape[0] = 0");
  EXPECT_HAS(load_error("[mesh]\nshape = [3]\n"), "train.batch = 8 must be divisible by the dp");
  EXPECT_HAS(load_error("[mesh]\nshape = [1, 8]\nnames = [\"dp\", \"tp\"]\n"),
             "divisible by the tp mesh dim (8)");
  EXPECT_HAS(load_error("[mesh]\nshape = [1, 2]\nnames = [\"dp\", \"tp\"]\nasync_tp = true\n"),
             "set mesh.sequence_parallel = true with tp > 1");
  EXPECT_HAS(load_error("[mesh]\nshape = [1, 3]\nnames = [\"dp\", \"tp\"]\nsequence_parallel = true\nasync_tp = true\n"
                        "[model]\nheads = 6\nkv_heads = 3\ndim = 192\nffn_dim = 384\n"),
             "train.seq = 64 must be divisible by the tp mesh dim (3)");
  EXPECT_HAS(load_error("[model]\nheads = 3\nkv_heads = 3\n"), "model.dim = 128 must be divisible");
  EXPECT_HAS(load_error("[model]\nkv_heads = 3\n"), "model.heads = 4 must be divisible");
  EXPECT_HAS(load_error("[model]\nvocab = 100\n"), "byte-level");
  EXPECT_HAS(load_error("[train]\nseq = 256\n"), "train.seq = 256 exceeds model.max_seq = 128");
  EXPECT_HAS(load_error("[train]\nlr = 0\n"), "train.lr = 0 must be > 0");
  EXPECT_HAS(load_error("[train]\nsteps = 0\n"), "train.steps = 0 must be >= 1");
  EXPECT_HAS(load_error("[low_precision]\nscaling = \"blockwise\"\n"), "low_precision.scaling = \"blockwise\" must be");
  EXPECT_HAS(load_error("[low_precision]\nscaling = \"rowwise\"\ndelayed = true\n"),
             "low_precision.delayed needs low_precision.scaling = \"tensorwise\"");
  EXPECT_HAS(load_error("[low_precision]\nhistory_len = 0\n"), "low_precision.history_len = 0 must be >= 1");
  EXPECT_HAS(load_error("[low_precision]\nscaling = \"rowwise\"\nfsdp_float8_all_gather = true\n"),
             "low_precision.fsdp_float8_all_gather needs low_precision.scaling = \"tensorwise\", not \"rowwise\"");
  EXPECT_HAS(load_error("[moe]\nnum_experts = 4\ntop_k = 5\n"), "MoE top_k 5 exceeds num_experts 4");
  EXPECT_HAS(load_error("[moe]\nnum_experts = 4\nnum_expert_groups = 3\nnum_limited_groups = 1\n"),
             "num_experts 4 must be a multiple of num_expert_groups 3");
  EXPECT_HAS(load_error("[mesh]\nshape = [2]\nnames = [\"ep\"]\n"), "needs a MoE model");
  EXPECT_HAS(load_error("[mesh]\nshape = [4]\nnames = [\"ep\"]\n[moe]\nnum_experts = 2\n"),
             "moe.num_experts = 2 is fewer than the ep mesh dim (4)");
  EXPECT_HAS(load_error("[mesh]\nshape = [2, 2]\nnames = [\"dp\", \"ep\"]\n[moe]\nnum_experts = 4\n[train]\nbatch = 6\n"),
             "divisible by the dp and ep mesh dims (2 x 2)");
  EXPECT_HAS(load_error("[memory]\nactivation_checkpoint = \"some\"\n"),
             "memory.activation_checkpoint = \"some\" must be");
  EXPECT_HAS(load_error("[memory]\nactivation_checkpoint = \"selective\"\nmemory_budget = 1.5\n"),
             "memory.memory_budget = 1.5 must be from 0 to 1");
  EXPECT_HAS(load_error("[memory]\nactivation_checkpoint = \"full\"\nmemory_budget = 0.5\n"),
             "memory.memory_budget needs memory.activation_checkpoint = \"selective\" or \"swap\"");
  EXPECT_HAS(load_error("[memory]\nactivation_checkpoint = \"full\"\nrelease_at_next_region = true\n"),
             "memory.release_at_next_region needs memory.activation_checkpoint = \"selective\"");
  EXPECT_HAS(load_error("[memory]\nactivation_checkpoint = \"swap\"\n"),
             "memory.activation_checkpoint = \"swap\" needs memory.activation_swap_dir");
  EXPECT_HAS(load_error("[memory]\nchunked_modules = [\"layers.*.mlp\"]\n"),
             "memory.chunked_modules are regions inside the checkpointed modules");
  EXPECT_HAS(load_error("[memory]\nactivation_checkpoint = \"full\"\ntoken_chunks = 0\n"), "memory.token_chunks");
  EXPECT_HAS(load_error("[mesh]\nshape = [2]\nnames = [\"pp\"]\n[pipeline]\nschedule = \"zb-h1\"\n"
                        "[memory]\nactivation_checkpoint = \"full\"\n"),
             "a fully recomputed region cannot");
  EXPECT_HAS(load_error("[memory]\noptimizer_offload_batch_mib = 0\n"), "memory.optimizer_offload_batch_mib = 0 must be >= 1");
  EXPECT_HAS(load_error("[train]\nmixed_precision_param = \"float16\"\n"),
             "train.mixed_precision_param = \"float16\" must be \"float32\" or \"bfloat16\"");
  EXPECT_HAS(load_error("[train]\nmuon_ns_dtype = \"float16\"\n"),
             "train.muon_ns_dtype = \"float16\" must be \"float32\" or \"bfloat16\"");
  EXPECT_HAS(load_error("[train]\nmixed_precision_param = \"bfloat16\"\n"),
             "need mesh.data_parallel = \"fsdp\", \"zero1\" or \"zero2\" (it casts through fully_shard, at dp = 1 too), "
             "not \"ddp\"");
  EXPECT_HAS(load_error("[train]\nmixed_precision_reduce = \"bfloat16\"\n[mesh]\ndata_parallel = \"replicate\"\n"),
             "not \"replicate\"");
  EXPECT_HAS(load_error("[train]\nmixed_precision_param = \"bfloat16\"\n[mesh]\ndata_parallel = \"zero2\"\n"
                        "shape = [2]\nnames = [\"pp\"]\n[model]\ntied_embeddings = false\n"),
             "with pipeline stages (pp = 2) are not supported yet");
}

// dualpipev puts two chunks on each pp rank and splits the backward, like zbv.
TEST(TrainConfig, DualPipeVIsAVScheduleWithSplitBackward) {
  const std::string pp2 = "[mesh]\nshape = [2]\nnames = [\"pp\"]\n[pipeline]\nschedule = \"dualpipev\"\n";
  TempFile f(pp2);
  EXPECT_EQ(hp::train::load_config(f.path()).stages_per_rank(), 2);
  EXPECT_HAS(load_error(pp2 + "microbatches = 3\n"), "num_microbatches >= 2 * num_ranks = 4, got 3");
  EXPECT_HAS(load_error(pp2 + "[model]\nlayers = 3\n"), "fewer than the 4 pipeline chunks");
  EXPECT_HAS(load_error("[mesh]\nshape = [2, 2]\nnames = [\"pp\", \"dp\"]\ndata_parallel = \"fsdp\"\n"
                        "[pipeline]\nschedule = \"dualpipev\"\n"),
             "splits the backward");
}

namespace {

// A valid config in which every key differs from its default, each set by hand so that a
// key missing from the table shows up as a value that did not survive.
TrainConfig all_changed() {
  TrainConfig c;
  c.mesh.shape = {2, 2};
  c.mesh.names = {"dp", "tp"};
  c.mesh.sequence_parallel = true;
  c.mesh.async_tp = true;
  c.mesh.data_parallel = "fsdp";
  c.mesh.context_parallel = "hybrid";  // no cp dim: its settings are not checked
  c.mesh.cp_load_balance = false;
  c.mesh.cp_ulysses_degree = 2;
  c.pipeline.schedule = "gpipe";  // not checked against the mesh without a pp dim
  c.pipeline.microbatches = 3;
  c.pipeline.virtual_stages = 2;
  c.pipeline.split = {1, 2};
  c.model.vocab = 300;
  c.model.dim = 96;
  c.model.layers = 3;
  c.model.heads = 6;
  c.model.kv_heads = 6;
  c.model.ffn_dim = 200;
  c.model.max_seq = 96;
  c.model.rope_theta = 123456.789;
  c.model.tied_embeddings = true;
  c.model.norm_eps = 1e-5;
  c.train.steps = 7;
  c.train.batch = 6;
  c.train.seq = 48;
  c.train.lr = 0.1;  // not exact in binary: the shortest round-trip digits must come back
  c.train.warmup = 3;
  c.train.weight_decay = 1.0 / 3;
  c.train.optimizer = "muon";
  c.train.muon_lr = 0.03;
  c.train.muon_ns_dtype = "bfloat16";
  c.train.grad_clip = 0.5;
  c.train.seed = 42;
  c.train.log_every = 5;
  c.train.deterministic = true;
  c.train.metrics_file = "runs/m \"1\"\t.jsonl";
  c.train.peak_tflops = 989.5;
  c.train.mixed_precision_param = "bfloat16";
  c.train.mixed_precision_reduce = "bfloat16";
  c.data.path = "data/corpus.txt";
  c.checkpoint.dir = "runs/ckpt";
  c.checkpoint.every = 50;
  c.checkpoint.keep = 0;
  c.checkpoint.async = false;
  c.checkpoint.resume = false;
  c.low_precision.scaling = "tensorwise";
  c.low_precision.delayed = true;
  c.low_precision.history_len = 4;
  c.low_precision.fsdp_float8_all_gather = true;
  c.moe.num_experts = 6;
  c.moe.top_k = 1;
  c.moe.hidden_dim = 32;
  c.moe.dense_layers = 2;
  c.moe.num_shared_experts = 1;
  c.moe.score_func = "sigmoid";
  c.moe.route_norm = true;
  c.moe.route_scale = 2.5;
  c.moe.num_expert_groups = 3;
  c.moe.num_limited_groups = 2;
  c.moe.aux_loss_coef = 0.01;
  c.moe.load_balance_bias = true;
  c.moe.bias_update_rate = 0.002;
  c.moe.capacity_factor = 1.25;
  c.moe.num_chunks = 3;
  c.memory.activation_checkpoint = "selective";
  c.memory.checkpoint_modules = {"layers.*.mlp"};
  c.memory.memory_budget = 0.5;
  c.memory.release_at_next_region = true;
  c.memory.activation_swap_dir = "/tmp/activations";
  c.memory.chunked_modules = {"layers.*.mlp.up_proj"};
  c.memory.token_chunks = 2;
  c.memory.optimizer_offload_dir = "/tmp/offload";
  c.memory.optimizer_offload_batch_mib = 8;
  c.memory.fsdp_offload_dir = "/tmp/fsdp_offload";
  c.monitor.every = 10;
  c.monitor.file = "runs/monitor.jsonl";
  c.monitor.spike_factor = 2.5;
  c.monitor.replica_check_every = 20;
  return c;
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

}  // namespace

TEST(TrainConfig, EveryFieldRoundTrips) {
  const TrainConfig c = all_changed();
  const TrainConfig defaults = hp::train::default_config();
  // all_changed() must keep up with the table: a new key needs a non-default value there.
  for (const auto& f : hp::train::config_fields())
    std::visit([&](const auto& slot) { EXPECT_NE(slot.read(c), slot.read(defaults)) << f.section << "." << f.key; },
               f.member);

  const TrainConfig d = hp::train::parse_config(c.to_string(), "round-trip");
  EXPECT_EQ(d.mesh.shape, c.mesh.shape);
  EXPECT_EQ(d.mesh.names, c.mesh.names);
  EXPECT_EQ(d.mesh.sequence_parallel, c.mesh.sequence_parallel);
  EXPECT_EQ(d.mesh.async_tp, c.mesh.async_tp);
  EXPECT_EQ(d.mesh.data_parallel, c.mesh.data_parallel);
  EXPECT_EQ(d.mesh.context_parallel, c.mesh.context_parallel);
  EXPECT_EQ(d.mesh.cp_load_balance, c.mesh.cp_load_balance);
  EXPECT_EQ(d.mesh.cp_ulysses_degree, c.mesh.cp_ulysses_degree);
  EXPECT_EQ(d.pipeline.schedule, c.pipeline.schedule);
  EXPECT_EQ(d.pipeline.microbatches, c.pipeline.microbatches);
  EXPECT_EQ(d.pipeline.virtual_stages, c.pipeline.virtual_stages);
  EXPECT_EQ(d.pipeline.split, c.pipeline.split);
  EXPECT_EQ(d.model.vocab, c.model.vocab);
  EXPECT_EQ(d.model.dim, c.model.dim);
  EXPECT_EQ(d.model.layers, c.model.layers);
  EXPECT_EQ(d.model.heads, c.model.heads);
  EXPECT_EQ(d.model.kv_heads, c.model.kv_heads);
  EXPECT_EQ(d.model.ffn_dim, c.model.ffn_dim);
  EXPECT_EQ(d.model.max_seq, c.model.max_seq);
  EXPECT_EQ(bits(d.model.rope_theta), bits(c.model.rope_theta));
  EXPECT_EQ(d.model.tied_embeddings, c.model.tied_embeddings);
  EXPECT_EQ(bits(d.model.norm_eps), bits(c.model.norm_eps));
  EXPECT_EQ(d.train.steps, c.train.steps);
  EXPECT_EQ(d.train.batch, c.train.batch);
  EXPECT_EQ(d.train.seq, c.train.seq);
  EXPECT_EQ(bits(d.train.lr), bits(c.train.lr));
  EXPECT_EQ(d.train.warmup, c.train.warmup);
  EXPECT_EQ(bits(d.train.weight_decay), bits(c.train.weight_decay));
  EXPECT_EQ(d.train.optimizer, c.train.optimizer);
  EXPECT_EQ(bits(d.train.muon_lr), bits(c.train.muon_lr));
  EXPECT_EQ(d.train.muon_ns_dtype, c.train.muon_ns_dtype);
  EXPECT_EQ(bits(d.train.grad_clip), bits(c.train.grad_clip));
  EXPECT_EQ(d.train.seed, c.train.seed);
  EXPECT_EQ(d.train.log_every, c.train.log_every);
  EXPECT_EQ(d.train.deterministic, c.train.deterministic);
  EXPECT_EQ(d.train.metrics_file, c.train.metrics_file);
  EXPECT_EQ(bits(d.train.peak_tflops), bits(c.train.peak_tflops));
  EXPECT_EQ(d.train.mixed_precision_param, c.train.mixed_precision_param);
  EXPECT_EQ(d.train.mixed_precision_reduce, c.train.mixed_precision_reduce);
  EXPECT_EQ(d.data.path, c.data.path);
  EXPECT_EQ(d.checkpoint.dir, c.checkpoint.dir);
  EXPECT_EQ(d.checkpoint.every, c.checkpoint.every);
  EXPECT_EQ(d.checkpoint.keep, c.checkpoint.keep);
  EXPECT_EQ(d.checkpoint.async, c.checkpoint.async);
  EXPECT_EQ(d.checkpoint.resume, c.checkpoint.resume);
  EXPECT_EQ(d.low_precision.scaling, c.low_precision.scaling);
  EXPECT_EQ(d.low_precision.delayed, c.low_precision.delayed);
  EXPECT_EQ(d.low_precision.history_len, c.low_precision.history_len);
  EXPECT_EQ(d.low_precision.fsdp_float8_all_gather, c.low_precision.fsdp_float8_all_gather);
  EXPECT_EQ(d.moe.num_experts, c.moe.num_experts);
  EXPECT_EQ(d.moe.top_k, c.moe.top_k);
  EXPECT_EQ(d.moe.hidden_dim, c.moe.hidden_dim);
  EXPECT_EQ(d.moe.dense_layers, c.moe.dense_layers);
  EXPECT_EQ(d.moe.num_shared_experts, c.moe.num_shared_experts);
  EXPECT_EQ(d.moe.score_func, c.moe.score_func);
  EXPECT_EQ(d.moe.route_norm, c.moe.route_norm);
  EXPECT_EQ(bits(d.moe.route_scale), bits(c.moe.route_scale));
  EXPECT_EQ(d.moe.num_expert_groups, c.moe.num_expert_groups);
  EXPECT_EQ(d.moe.num_limited_groups, c.moe.num_limited_groups);
  EXPECT_EQ(bits(d.moe.aux_loss_coef), bits(c.moe.aux_loss_coef));
  EXPECT_EQ(d.moe.load_balance_bias, c.moe.load_balance_bias);
  EXPECT_EQ(bits(d.moe.bias_update_rate), bits(c.moe.bias_update_rate));
  EXPECT_EQ(bits(d.moe.capacity_factor), bits(c.moe.capacity_factor));
  EXPECT_EQ(d.moe.num_chunks, c.moe.num_chunks);
  EXPECT_EQ(d.memory.activation_checkpoint, c.memory.activation_checkpoint);
  EXPECT_EQ(d.memory.checkpoint_modules, c.memory.checkpoint_modules);
  EXPECT_EQ(bits(d.memory.memory_budget), bits(c.memory.memory_budget));
  EXPECT_EQ(d.memory.release_at_next_region, c.memory.release_at_next_region);
  EXPECT_EQ(d.memory.activation_swap_dir, c.memory.activation_swap_dir);
  EXPECT_EQ(d.memory.chunked_modules, c.memory.chunked_modules);
  EXPECT_EQ(d.memory.token_chunks, c.memory.token_chunks);
  EXPECT_EQ(d.memory.optimizer_offload_dir, c.memory.optimizer_offload_dir);
  EXPECT_EQ(d.memory.optimizer_offload_batch_mib, c.memory.optimizer_offload_batch_mib);
  EXPECT_EQ(d.memory.fsdp_offload_dir, c.memory.fsdp_offload_dir);
  EXPECT_EQ(d.monitor.every, c.monitor.every);
  EXPECT_EQ(d.monitor.file, c.monitor.file);
  EXPECT_EQ(bits(d.monitor.spike_factor), bits(c.monitor.spike_factor));
  EXPECT_EQ(d.monitor.replica_check_every, c.monitor.replica_check_every);
}

// The printed [section] and `key = ` lines are exactly the table's rows, in its order.
TEST(TrainConfig, PrinterPrintsTheTable) {
  std::vector<std::string> printed, table;
  std::istringstream text(hp::train::default_config().to_string());
  std::string line, section;
  while (std::getline(text, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    auto eq = line.find(" = ");
    ASSERT_NE(eq, std::string::npos) << line;
    printed.push_back(section + "." + line.substr(0, eq));
  }
  for (const auto& f : hp::train::config_fields()) table.push_back(f.section + "." + f.key);
  EXPECT_EQ(printed, table);
  // 8 mesh, 4 pipeline, 10 model, 15 moe, 17 train, 1 data, 5 checkpoint, 4 low_precision, 10 memory, 4 monitor
  EXPECT_EQ(table.size(), 78u);
  EXPECT_EQ(hp::train::config_sections(), (std::vector<std::string>{"mesh", "pipeline", "model", "moe", "train", "data",
                                                                    "checkpoint", "low_precision", "memory",
                                                                    "monitor"}));
}
