#include "hp/train/plan_bridge.h"

#include "hp/base/error.h"

namespace hp::train {

plan::ModelDesc model_desc_of(const TrainConfig& c) {
  plan::ModelDesc m;
  m.name = c.source;
  m.layers = c.model.layers;
  m.hidden = c.model.dim;
  m.heads = c.model.heads;
  m.kv_heads = c.model.kv_heads;
  m.ffn = c.model.ffn_dim;
  m.vocab = c.model.vocab;
  m.seq_len = c.train.seq;
  m.tied_embeddings = c.model.tied_embeddings;
  if (c.moe.enabled()) {
    m.experts = c.moe.num_experts;
    m.top_k = c.moe.top_k;
    m.moe_ffn = c.moe.hidden_dim;
    m.shared_experts = c.moe.num_shared_experts;
    m.dense_layers = c.moe.dense_layers;
  }
  return m;
}

TrainConfig config_of(const plan::ModelDesc& m, const plan::Strategy& s) {
  HP_CHECK(m.head_size() * m.heads == m.hidden)
      << "model " << m.name << " has head_dim " << m.head_size() << " x " << m.heads << " heads != hidden "
      << m.hidden << "; the trainer's Llama needs head_dim = hidden / heads";
  TrainConfig cfg = default_config();
  cfg.model.vocab = m.vocab;
  cfg.model.dim = m.hidden;
  cfg.model.layers = m.layers;
  cfg.model.heads = m.heads;
  cfg.model.kv_heads = m.kv_heads;
  cfg.model.ffn_dim = m.ffn;
  cfg.model.max_seq = m.seq_len;
  cfg.model.tied_embeddings = m.tied_embeddings;
  cfg.train.seq = m.seq_len;
  if (m.is_moe()) {
    cfg.moe.num_experts = m.experts;
    cfg.moe.top_k = m.top_k;
    cfg.moe.hidden_dim = m.moe_ffn;
    cfg.moe.num_shared_experts = m.shared_experts;
    cfg.moe.dense_layers = m.dense_layers;
  }
  apply_strategy(cfg, s);
  cfg.source = "strategy " + plan::to_string(s);
  return cfg;
}

void apply_strategy(TrainConfig& cfg, const plan::Strategy& s) {
  cfg.train.batch = s.global_batch;
  const ParallelDims dims = ParallelDims::from_strategy(s);
  cfg.mesh.shape = dims.config_shape();
  cfg.mesh.names = dims.config_names();
  cfg.mesh.sequence_parallel = plan::runs_sequence_parallel(s, cfg.moe.enabled());
  cfg.mesh.context_parallel = s.cp_mode;
  cfg.mesh.cp_ulysses_degree = s.cp_mode == "hybrid" ? s.cp_ulysses : 1;
  static const char* const stages[] = {"ddp", "zero1", "zero2", "fsdp"};
  cfg.mesh.data_parallel = stages[s.zero];
  // Each layer is one checkpointed region; selective keeps the default policy's outputs,
  // as the estimator counts them; full_chunked also makes each dense layer's MLP a region
  // inside, in token chunks.
  static const char* const recompute[] = {"", "selective", "full", "full"};
  cfg.memory.activation_checkpoint = recompute[static_cast<int>(s.recompute)];
  cfg.memory.checkpoint_modules = MemoryConfig{}.checkpoint_modules;
  cfg.memory.chunked_modules = {};
  if (s.recompute == plan::Recompute::FullChunked) {
    cfg.memory.chunked_modules = {"layers.*.mlp"};
    cfg.memory.token_chunks = plan::kRecomputeTokenChunks;
  }
  cfg.memory.memory_budget = 0;
  cfg.pipeline = PipelineConfig{};
  if (s.pp > 1) {
    cfg.pipeline.schedule = s.schedule;
    cfg.pipeline.microbatches = s.microbatches;
    cfg.pipeline.virtual_stages = s.schedule == "interleaved-1f1b" ? s.virtual_stages : 0;
  }
}

}  // namespace hp::train
