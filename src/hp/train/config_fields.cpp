#include "hp/train/config_fields.h"

#include <type_traits>
#include <utility>

namespace hp::train {

namespace {

// The member `Key` of the section `Section`, e.g. at<&TrainConfig::model, &ModelConfig::dim>().
template <auto Section, auto Key>
Member at() {
  using T = std::decay_t<decltype(std::declval<TrainConfig&>().*Section.*Key)>;
  return Slot<T>{[](const TrainConfig& c) -> const T& { return c.*Section.*Key; },
                 [](TrainConfig& c) -> T& { return c.*Section.*Key; }};
}

using T = TrainConfig;
using Mesh = MeshConfig;
using Pipe = PipelineConfig;
using Model = ModelConfig;
using Loop = LoopConfig;
using Data = DataConfig;
using Ckpt = CheckpointConfig;
using Precision = PrecisionConfig;
using Mon = MonitorConfig;
using MoE = MoEConfig;
using Mem = MemoryConfig;

std::vector<Field> make_fields() {
  return {
      {"mesh", "shape", "devices per mesh dim; product = world size", at<&T::mesh, &Mesh::shape>()},
      {"mesh", "names", "a name per dim: dp, tp, cp, ep or pp", at<&T::mesh, &Mesh::names>()},
      {"mesh", "sequence_parallel", "shard norms and activations along seq inside tp",
       at<&T::mesh, &Mesh::sequence_parallel>()},
      {"mesh", "async_tp", "sequence-parallel collectives in pieces behind the matmuls (needs sequence_parallel)",
       at<&T::mesh, &Mesh::async_tp>()},
      {"mesh", "data_parallel", "ddp, replicate, zero1, zero2 or fsdp", at<&T::mesh, &Mesh::data_parallel>()},
      {"mesh", "context_parallel", "attention over cp: ulysses, ring, allgather_kv or hybrid",
       at<&T::mesh, &Mesh::context_parallel>()},
      {"mesh", "cp_load_balance", "each cp rank holds a head and a tail of every sequence",
       at<&T::mesh, &Mesh::cp_load_balance>()},
      {"mesh", "cp_ulysses_degree", "hybrid: cp ranks running Ulysses inside a host; the ring spans the rest",
       at<&T::mesh, &Mesh::cp_ulysses_degree>()},

      {"pipeline", "schedule", "gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv or dualpipev",
       at<&T::pipeline, &Pipe::schedule>()},
      {"pipeline", "microbatches", "per step; 0 = 2 * pp", at<&T::pipeline, &Pipe::microbatches>()},
      {"pipeline", "virtual_stages", "chunks per pp rank; 0 = the schedule's own",
       at<&T::pipeline, &Pipe::virtual_stages>()},
      {"pipeline", "split", "blocks per chunk; empty = balanced by the cost model", at<&T::pipeline, &Pipe::split>()},

      {"model", "vocab", "token ids; >= 256 (byte-level tokenizer)", at<&T::model, &Model::vocab>()},
      {"model", "dim", "hidden size", at<&T::model, &Model::dim>()},
      {"model", "layers", "transformer blocks", at<&T::model, &Model::layers>()},
      {"model", "heads", "query heads", at<&T::model, &Model::heads>()},
      {"model", "kv_heads", "key/value heads (grouped-query attention)", at<&T::model, &Model::kv_heads>()},
      {"model", "ffn_dim", "hidden size of the feed-forward", at<&T::model, &Model::ffn_dim>()},
      {"model", "max_seq", "longest sequence the rotary tables cover", at<&T::model, &Model::max_seq>()},
      {"model", "rope_theta", "rotary embedding base", at<&T::model, &Model::rope_theta>()},
      {"model", "tied_embeddings", "the head reuses the embedding weight", at<&T::model, &Model::tied_embeddings>()},
      {"model", "norm_eps", "RMSNorm epsilon", at<&T::model, &Model::norm_eps>()},

      {"moe", "num_experts", "routed experts per MoE block; 0 = a dense Llama", at<&T::moe, &MoE::num_experts>()},
      {"moe", "top_k", "experts per token", at<&T::moe, &MoE::top_k>()},
      {"moe", "hidden_dim", "each expert's SwiGLU width", at<&T::moe, &MoE::hidden_dim>()},
      {"moe", "dense_layers", "first blocks that keep the dense MLP", at<&T::moe, &MoE::dense_layers>()},
      {"moe", "num_shared_experts", "always-on experts per MoE block", at<&T::moe, &MoE::num_shared_experts>()},
      {"moe", "score_func", "softmax or sigmoid", at<&T::moe, &MoE::score_func>()},
      {"moe", "route_norm", "renormalise the top-k scores", at<&T::moe, &MoE::route_norm>()},
      {"moe", "route_scale", "multiplies the routing weights", at<&T::moe, &MoE::route_scale>()},
      {"moe", "num_expert_groups", "group-limited routing: expert groups; 0 = off", at<&T::moe, &MoE::num_expert_groups>()},
      {"moe", "num_limited_groups", "groups a token may use", at<&T::moe, &MoE::num_limited_groups>()},
      {"moe", "aux_loss_coef", "load-balancing loss weight; 0 = off", at<&T::moe, &MoE::aux_loss_coef>()},
      {"moe", "load_balance_bias", "auxiliary-loss-free balancing by expert bias", at<&T::moe, &MoE::load_balance_bias>()},
      {"moe", "bias_update_rate", "step of the expert bias per optimizer step", at<&T::moe, &MoE::bias_update_rate>()},
      {"moe", "capacity_factor", "tokens an expert takes from a rank, times the even share; 0 = dropless",
       at<&T::moe, &MoE::capacity_factor>()},
      {"moe", "num_chunks", "expert parallel: token exchange in chunks overlapped with the experts; 1 = one",
       at<&T::moe, &MoE::num_chunks>()},

      {"train", "steps", "optimizer steps", at<&T::train, &Loop::steps>()},
      {"train", "batch", "global: sequences per step over all dp ranks", at<&T::train, &Loop::batch>()},
      {"train", "seq", "tokens per sequence", at<&T::train, &Loop::seq>()},
      {"train", "lr", "peak learning rate (AdamW), cosine after warmup", at<&T::train, &Loop::lr>()},
      {"train", "warmup", "linear warmup steps", at<&T::train, &Loop::warmup>()},
      {"train", "weight_decay", "decoupled weight decay", at<&T::train, &Loop::weight_decay>()},
      {"train", "optimizer", "adamw or muon", at<&T::train, &Loop::optimizer>()},
      {"train", "muon_lr", "Muon's learning rate on the blocks' matrices", at<&T::train, &Loop::muon_lr>()},
      {"train", "muon_ns_dtype", "float32 or bfloat16: Muon's Newton-Schulz iteration", at<&T::train, &Loop::muon_ns_dtype>()},
      {"train", "grad_clip", "max global grad norm; 0 = off", at<&T::train, &Loop::grad_clip>()},
      {"train", "seed", "weights' initialisation and data order", at<&T::train, &Loop::seed>()},
      {"train", "log_every", "steps between log lines", at<&T::train, &Loop::log_every>()},
      {"train", "deterministic", "deterministic kernels only", at<&T::train, &Loop::deterministic>()},
      {"train", "metrics_file", "JSON lines of every logged step; \"\" = none", at<&T::train, &Loop::metrics_file>()},
      {"train", "peak_tflops", "per rank, for MFU; 0 = measured at start", at<&T::train, &Loop::peak_tflops>()},
      {"train", "mixed_precision_param", "float32 or bfloat16: gathered parameters and compute (fully_shard)",
       at<&T::train, &Loop::mixed_precision_param>()},
      {"train", "mixed_precision_reduce", "float32 or bfloat16: gradient reduction (fully_shard)",
       at<&T::train, &Loop::mixed_precision_reduce>()},

      {"data", "path", "text corpus; \"\" = the fortunes corpus", at<&T::data, &Data::path>()},

      {"checkpoint", "dir", "where checkpoints go; \"\" = none", at<&T::checkpoint, &Ckpt::dir>()},
      {"checkpoint", "every", "steps between checkpoints; 0 = only the last", at<&T::checkpoint, &Ckpt::every>()},
      {"checkpoint", "keep", "checkpoints kept; 0 = all", at<&T::checkpoint, &Ckpt::keep>()},
      {"checkpoint", "async", "write in the background", at<&T::checkpoint, &Ckpt::async>()},
      {"checkpoint", "resume", "start from the latest checkpoint in dir", at<&T::checkpoint, &Ckpt::resume>()},

      {"low_precision", "scaling", "FP8 block Linears: tensorwise, rowwise or mx_block; \"\" = off",
       at<&T::low_precision, &Precision::scaling>()},
      {"low_precision", "delayed", "tensorwise scales from an amax history", at<&T::low_precision, &Precision::delayed>()},
      {"low_precision", "history_len", "steps in the amax history", at<&T::low_precision, &Precision::history_len>()},
      {"low_precision", "fsdp_float8_all_gather", "fully_shard gathers the FP8 weights in FP8 (tensorwise)",
       at<&T::low_precision, &Precision::fsdp_float8_all_gather>()},
      {"memory", "activation_checkpoint",
       "recompute activations in backward: full, selective; or swap them to files; \"\" = off",
       at<&T::memory, &Mem::activation_checkpoint>()},
      {"memory", "checkpoint_modules", "name patterns of the checkpointed modules",
       at<&T::memory, &Mem::checkpoint_modules>()},
      {"memory", "chunked_modules",
       "name patterns of modules inside the checkpointed ones recomputed token chunk by chunk (row-wise ones, "
       "e.g. layers.*.mlp)",
       at<&T::memory, &Mem::chunked_modules>()},
      {"memory", "token_chunks", "chunks of the chunked_modules' rows", at<&T::memory, &Mem::token_chunks>()},
      {"memory", "memory_budget",
       "selective, swap: fraction of activations kept in memory, 0 to 1 (swap: the products beyond it go to the "
       "files); 0 = the policy decides",
       at<&T::memory, &Mem::memory_budget>()},
      {"memory", "release_at_next_region",
       "selective: a block lets go of what it drops when the next one starts, so the last replays nothing",
       at<&T::memory, &Mem::release_at_next_region>()},
      {"memory", "activation_swap_dir",
       "swap: the checkpointed modules' activations in files here between forward and backward (a dir per rank)",
       at<&T::memory, &Mem::activation_swap_dir>()},
      {"memory", "optimizer_offload_dir", "AdamW state in files here between steps; \"\" = off",
       at<&T::memory, &Mem::optimizer_offload_dir>()},
      {"memory", "fsdp_offload_dir",
       "fully_shard's parameter and gradient shards in files here between uses (with the optimizer state); \"\" = off",
       at<&T::memory, &Mem::fsdp_offload_dir>()},
      {"memory", "optimizer_offload_batch_mib", "parameters per streamed batch of optimizer state",
       at<&T::memory, &Mem::optimizer_offload_batch_mib>()},
      {"monitor", "every", "steps between per-module norm and non-finite checks; 0 = off",
       at<&T::monitor, &Mon::every>()},
      {"monitor", "file", "JSON lines of norms and spikes; \"\" = none", at<&T::monitor, &Mon::file>()},
      {"monitor", "spike_factor", "flag a loss or grad norm above this times the recent median; 0 = off",
       at<&T::monitor, &Mon::spike_factor>()},
      {"monitor", "replica_check_every", "steps between checksums of replicated parameters; 0 = off",
       at<&T::monitor, &Mon::replica_check_every>()},
  };
}

}  // namespace

const std::vector<Field>& config_fields() {
  static const std::vector<Field> fields = make_fields();
  return fields;
}

std::vector<std::string> config_sections() {
  std::vector<std::string> sections;
  for (const auto& f : config_fields())
    if (sections.empty() || sections.back() != f.section) sections.push_back(f.section);
  return sections;
}

}  // namespace hp::train
