// The trainer's configuration: every field has a default, a TOML file overrides
// any of them. Torch-free, so tools (dry-run, planner) can read it cheaply.
// A field's TOML key is declared once, in config_fields.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hp/nn/llama_config.h"
#include "hp/nn/moe_llama_config.h"
#include "hp/train/parallel_dims.h"

namespace hp::train {

// Mesh dims by name: "dp" (data parallel), "tp" (tensor parallel), "pp" (pipeline stages),
// "ep" (expert parallel: experts sharded over it, and, like dp, each rank its own rows of
// the batch); with pp, each stage runs on the ranks of the other dims at one pp coordinate.
struct MeshConfig {
  std::vector<int64_t> shape{1};       // devices per mesh dim; product = world size
  std::vector<std::string> names{"dp"};
  bool sequence_parallel = false;      // shard norms/activations along seq inside tp
  // The sequence-parallel all-gathers and reduce-scatters split into per-rank pieces that
  // travel while other pieces multiply (parallel/async_tp.h); needs sequence_parallel.
  bool async_tp = false;
  // How dp ranks combine gradients and share state: "ddp" (bucketed all-reduce overlapped
  // with backward), "replicate" (each use of a parameter all-reduces its gradient inside
  // autograd), or fully_shard at a ZeRO stage: "zero1" (optimizer states sharded; parameters
  // gathered once per step and gradients reduced once per step), "zero2" (gradients sharded
  // too: reduced after every microbatch), "fsdp" (ZeRO-3: parameters sharded too, gathered
  // for every forward and backward).
  std::string data_parallel = "ddp";
  int zero_stage() const;  // 0 for ddp and replicate, else 1, 2 or 3
  // Attention over the mesh dim "cp", which shards every sequence: "ulysses", "ring",
  // "allgather_kv" or "hybrid" (hp/parallel/context_parallel.h); cp_load_balance holds each
  // rank's share as a head and a tail of the sequence, so that causal attention costs every
  // rank the same. hybrid splits cp into a ring of cp / cp_ulysses_degree ranks across hosts
  // (mesh dim "cp_ring", outer) and Ulysses over cp_ulysses_degree ranks inside one
  // ("cp_ulysses", inner).
  std::string context_parallel = "ring";
  bool cp_load_balance = true;
  int64_t cp_ulysses_degree = 1;
};

// Pipeline parallelism over the mesh dim "pp": the model is cut into chunks of consecutive
// blocks (the embedding goes with the first, the norm, head and loss with the last), placed
// on the pp ranks by the schedule. virtual_stages is not a mesh dim: it is how many chunks
// each pp rank holds.
struct PipelineConfig {
  std::string schedule = "1f1b";  // gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv or dualpipev (`hp schedule`)
  int64_t microbatches = 0;       // per step; 0 = 2 * pp
  int64_t virtual_stages = 0;     // chunks per pp rank; 0 = the schedule's own (2 for interleaved-1f1b, zbv, dualpipev)
  std::vector<int64_t> split;     // blocks per chunk; empty = balanced by the cost model (`hp schedule --split`)
};

// A small Llama-style decoder; vocab >= 256 because the tokenizer is byte-level.
using ModelConfig = nn::LlamaConfig;

// [moe]: with num_experts > 0 the model is a MoELlama (nn/moe_llama.h): blocks from
// dense_layers on route tokens to experts of hidden_dim; the rest as nn::MoEOptions.
struct MoEConfig : nn::MoEOptions {
  MoEConfig() { num_experts = 0; }
  int64_t hidden_dim = 64;
  int64_t dense_layers = 1;
  bool enabled() const { return num_experts > 0; }
  nn::MoELlamaConfig model(const nn::LlamaConfig& llama) const {
    nn::MoELlamaConfig c;
    c.llama = llama, c.moe = *this, c.moe_hidden_dim = hidden_dim, c.dense_layers = dense_layers;
    return c;
  }
};

struct LoopConfig {
  int64_t steps = 200;
  int64_t batch = 8;          // global: sequences per step over all dp ranks
  int64_t seq = 64;
  double lr = 3e-3;
  int64_t warmup = 10;        // linear warmup steps
  double weight_decay = 0.0;
  std::string optimizer = "adamw";  // or "muon": Muon on the blocks' matrices, AdamW (lr) on the rest
  double muon_lr = 0.02;
  std::string muon_ns_dtype = "float32";  // or "bfloat16": Muon's Newton-Schulz iteration
  double grad_clip = 1.0;     // max global grad norm; 0 = off
  uint64_t seed = 0;
  int64_t log_every = 10;
  bool deterministic = false;
  std::string metrics_file;   // JSON lines of every logged step (`hp plot`); "" = none
  double peak_tflops = 0;     // per rank, for MFU; 0 = measured once at start (a float32 matmul)
  // Mixed precision through fully_shard's MixedPrecisionPolicy (mesh.data_parallel = zero1,
  // zero2 or fsdp; at dp = 1 fully_shard then only casts): parameters gathered and computed
  // in mixed_precision_param, gradients reduced in mixed_precision_reduce; master weights,
  // gradients on them and optimizer state stay float32, and so do the logits into the loss.
  std::string mixed_precision_param = "float32";   // or "bfloat16"
  std::string mixed_precision_reduce = "float32";  // or "bfloat16"
  bool mixed_precision() const {
    return mixed_precision_param != "float32" || mixed_precision_reduce != "float32";
  }
};

struct DataConfig {
  std::string path;  // "" = the fortunes corpus
};

// Checkpoints under `dir` (none when empty): every `every` steps and at the last step.
struct CheckpointConfig {
  std::string dir;
  int64_t every = 0;    // 0 = only at the last step
  int64_t keep = 2;     // checkpoints kept; 0 = all
  bool async = true;    // write in the background while training goes on
  bool resume = true;   // start from the latest checkpoint in dir when there is one
};

// FP8 linear layers in the transformer blocks (the head stays float32), applied after
// tensor parallelism (hp::apply_low_precision); off while scaling is "".
struct PrecisionConfig {
  std::string scaling;   // "" = off; tensorwise, rowwise or mx_block
  bool delayed = false;  // tensorwise only: scales from an amax history
  int64_t history_len = 16;
  bool fsdp_float8_all_gather = false;  // tensorwise only: fully_shard gathers these weights in FP8
};

// Activation checkpointing (hp::checkpoint_wrapper) of the modules named, applied after
// tensor parallelism and before data parallelism; off while activation_checkpoint is "".
// Optimizer state offloaded to files (hp::memory::SwapOptimizer); off while the dir is "".
struct MemoryConfig {
  std::string activation_checkpoint;                   // "" = off; full, selective or swap
  std::vector<std::string> checkpoint_modules{"layers.*"};
  // Modules inside the checkpointed ones recomputed as full regions of their own, their rows
  // (tokens) in token_chunks chunks one after another (["layers.*.mlp"]); [] = none.
  std::vector<std::string> chunked_modules;
  int64_t token_chunks = 4;
  double memory_budget = 0;  // selective, swap: fraction of each region's activations kept in memory; 0 = the policy decides
  bool release_at_next_region = false;  // selective, swap: CheckpointOptions::release_at_next_region
  std::string activation_swap_dir;      // swap: the activations in files here (a dir per rank)
  std::string optimizer_offload_dir;    // optimizer state in files here between steps (a dir per rank); "" = off
  int64_t optimizer_offload_batch_mib = 64;  // parameters per streamed batch
  // fully_shard's parameter and gradient shards in files here between uses (FileOffloadPolicy,
  // a dir per rank and unit); the optimizer then streams them with its state. "" = off.
  std::string fsdp_offload_dir;
};

// The precision monitor (monitor.h): each part is off at 0 and costs nothing then.
struct MonitorConfig {
  int64_t every = 0;               // steps between per-module norm and non-finite checks; 0 = off
  std::string file;                // JSON lines of norms and spikes (`hp monitor plot`, `hp diff`); "" = none
  double spike_factor = 0;         // flag a loss or grad norm above this times the last 20 steps' median; 0 = off
  int64_t replica_check_every = 0; // steps between cross-rank checksums of replicated parameters; 0 = off

  bool enabled() const { return every > 0 || spike_factor > 0 || replica_check_every > 0; }
};

struct TrainConfig {
  MeshConfig mesh;
  PipelineConfig pipeline;
  ModelConfig model;
  MoEConfig moe;
  LoopConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  PrecisionConfig low_precision;
  MemoryConfig memory;
  MonitorConfig monitor;
  std::string source = "<defaults>";  // file it was read from, for messages

  // Size of the mesh dim called `name`, 1 if the mesh has none.
  // The layout [mesh] declares (throws naming a bad mesh); mesh_size("pp") is dims().pp.
  ParallelDims dims() const;
  int64_t mesh_size(const std::string& name) const;
  // Global rank `rank`'s coordinate on the trainer's mesh dim called `name` (the mesh of
  // dims(), ranks row-major over it), 0 if it has none.
  int64_t mesh_coordinate(const std::string& name, int64_t rank) const;
  int64_t world_size() const;  // product of mesh.shape
  // With pp > 1: the schedule's chunks per pp rank and microbatches, defaults resolved.
  int64_t stages_per_rank() const;
  int64_t microbatches() const;

  // The resolved config as TOML that load_config reads back to the same values.
  std::string to_string() const;
};

TrainConfig default_config();

// Reads `path`; unknown keys, wrong types and inconsistent values are errors
// naming the file, the key and the value.
TrainConfig load_config(const std::string& path);

// Parses TOML text; `source` names it in errors.
TrainConfig parse_config(const std::string& toml_text, const std::string& source);

// Cross-field checks (shapes divide, sizes positive); load_config calls it.
void validate(const TrainConfig& c);

}  // namespace hp::train
