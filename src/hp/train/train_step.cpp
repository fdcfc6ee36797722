#include "hp/train/train_step.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/comm/collectives.h"
#include "hp/comm/trace.h"
#include "hp/comm/world.h"
#include "hp/memory/checkpoint.h"
#include "hp/memory/storage_tier.h"
#include "hp/memory/swap_optimizer.h"
#include "hp/optim/adamw.h"
#include "hp/optim/chained.h"

namespace hp::train {
namespace {

// fully_shard over dp (and ep): at a ZeRO stage with dp x ep > 1, and at 1 too with mixed precision
// (validate() has refused it with other data_parallel values), where it only casts.
bool shards_data(const TrainConfig& cfg) {
  return cfg.mesh.zero_stage() > 0 && (cfg.dims().data_parallel_size() > 1 || cfg.train.mixed_precision());
}

at::ScalarType dtype_named(const std::string& name) { return name == "bfloat16" ? at::kBFloat16 : at::kFloat; }

FullyShardOptions shard_options(const TrainConfig& cfg) {
  FullyShardOptions o;
  if (cfg.train.mixed_precision())
    o.mp_policy = {dtype_named(cfg.train.mixed_precision_param), dtype_named(cfg.train.mixed_precision_reduce)};
  return zero_stage_options(cfg.mesh.zero_stage(), o);
}

// The options of the whole model's fully_shard at pp = 1.
FullyShardOptions whole_model_shard_options(const TrainConfig& cfg, const DeviceMesh& mesh) {
  FullyShardOptions o = shard_options(cfg);
  o.offload_policy = detail::shard_offload_policy(cfg, mesh);
  return o;
}

// A dir per rank: ranks may share a disk.
std::string rank_dir(const std::string& dir) {
  return dir + "/rank" + std::to_string(comm::current_world()->rank());
}

// The loss (and the loss reported) in float32 whatever the compute dtype, as torchtitan's
// cross-entropy casts its logits: a bfloat16 loss keeps 3 significant digits.
void logits_in_float32(nn::Module& model, const TrainConfig& cfg) {
  if (cfg.train.mixed_precision_param == "float32") return;
  model.register_forward_hook([](nn::Module&, const DTensor&, const DTensor& y) {
    if (y.scalar_type() == at::kFloat) return y;
    return DTensor(y.to_local().to(at::kFloat), y.device_mesh(),
                   make_spec(y.sizes(), at::kFloat, y.device_mesh(), y.placements()));
  });
}

// The MoE Llama: tensor parallel, experts over ep, then data parallel. ep splits the batch
// too: ddp sums the gradients of the parameters outside the experts over dp x ep in its
// buckets, fully_shard shards those parameters over dp x ep and reduces them there at once.
void build_moe_model(Training& t, const TrainConfig& cfg) {
  DeviceMesh& mesh = t.stage_mesh;
  t.moe_llama = detail::build_moe_llama(cfg, mesh);
  nn::MoELlama& model = *t.moe_llama;
  const std::vector<std::string> reduce_dims = detail::gradient_reduce_dims(cfg);
  if (shards_data(cfg)) {
    const FullyShardOptions o = whole_model_shard_options(cfg, mesh);
    const auto [others, experts] = detail::moe_shard_meshes(mesh);
    detail::shard_and_draw(t, model, o, [&, &others = others, &experts = experts] {  // C++17 captures no bindings
      return fully_shard_moe_llama(model, others, experts, o);
    });
    logits_in_float32(model, cfg);
  } else {
    nn::init_parameters(model);
    if (cfg.mesh.data_parallel == "ddp" && !reduce_dims.empty())
      t.ddp.push_back(std::make_unique<DistributedDataParallel>(model, mesh.submesh(reduce_dims)));
  }
  t.model = t.moe_llama;
}

void build_whole_model(Training& t, const TrainConfig& cfg) {
  if (cfg.moe.enabled()) return build_moe_model(t, cfg);
  const ParallelDims dims = cfg.dims();
  DeviceMesh& mesh = t.stage_mesh;
  {
    auto deferred = nn::no_init_parameters();  // each rank draws its own shards below
    t.llama = std::make_shared<nn::Llama>(cfg.model, mesh);
  }
  nn::Llama& model = *t.llama;
  if (dims.tp > 1) parallelize_llama(model, mesh["tp"], {cfg.mesh.sequence_parallel, /*loss_parallel=*/true, cfg.mesh.async_tp});
  detail::apply_context_parallel(model, mesh, cfg);
  detail::apply_precision(model, cfg);
  detail::apply_activation_checkpointing(model, cfg);
  // Data parallelism from outside the model, after tensor parallelism.
  const std::vector<std::string> reduce_dims = detail::gradient_reduce_dims(cfg);
  if (shards_data(cfg)) {
    const FullyShardOptions o = whole_model_shard_options(cfg, mesh);
    detail::shard_and_draw(t, model, o, [&] { return fully_shard_llama(model, detail::fully_shard_mesh(mesh, cfg), o); });
    logits_in_float32(model, cfg);
  } else {
    nn::init_parameters(model);
    if (!reduce_dims.empty())
      t.ddp.push_back(std::make_unique<DistributedDataParallel>(model, mesh.submesh(reduce_dims)));
  }
  t.model = t.llama;
}

}  // namespace

std::shared_ptr<nn::MoELlama> detail::build_moe_llama(const TrainConfig& cfg, const DeviceMesh& mesh) {
  const ParallelDims dims = cfg.dims();
  std::shared_ptr<nn::MoELlama> model;
  {
    auto deferred = nn::no_init_parameters();  // the caller draws each rank's shards (nn::init_parameters)
    model = std::make_shared<nn::MoELlama>(cfg.moe.model(cfg.model), mesh);
  }
  if (dims.tp > 1)
    parallelize_moe_llama(*model, mesh["tp"], {/*loss_parallel=*/true, cfg.mesh.sequence_parallel, cfg.mesh.async_tp});
  if (dims.ep > 1) expert_parallelize_moe_llama(*model, mesh["ep"]);
  apply_precision(*model, cfg);
  // The auxiliary losses' gradients enter at their layers' outputs, so that a checkpointed
  // block's recompute builds them too; the loss adds their values (a pipeline stage, each
  // microbatch's share: build_pipeline sets it).
  for (nn::MoE* moe : nn::moe_layers(*model)) moe->set_aux_loss_carry(1.0);
  apply_activation_checkpointing(*model, cfg);
  return model;
}

std::pair<DeviceMesh, DeviceMesh> detail::moe_shard_meshes(const DeviceMesh& stage_mesh) {
  std::vector<std::string> data_dims;
  for (const std::string& name : stage_mesh.dim_names())
    if (name == "dp" || name == "ep") data_dims.push_back(name);
  const auto& names = stage_mesh.dim_names();
  DeviceMesh experts = std::find(names.begin(), names.end(), "dp") != names.end()
                           ? stage_mesh["dp"]
                           : DeviceMesh(stage_mesh.device_type(), MeshShape({1}, {"expert_dp"}, {stage_mesh.rank()}));
  if (data_dims.size() == 1) return {stage_mesh[data_dims[0]], experts};
  return {stage_mesh.submesh(data_dims).flatten("dp_ep"), experts};
}

void detail::apply_context_parallel(nn::Llama& model, const DeviceMesh& stage_mesh, const TrainConfig& cfg) {
  const ParallelDims dims = cfg.dims();
  if (dims.cp == 1) return;
  const std::vector<std::string> cp_dims = dims.cp_dims();
  ContextParallelOptions cp;
  cp.mode = cp_mode_from_string(cfg.mesh.context_parallel);
  cp.load_balance = cfg.mesh.cp_load_balance;
  if (cp_dims.size() == 2) cp.ulysses_dim = cp_dims[1];
  parallelize_module(model, stage_mesh[cp_dims[0]], {{"layers.*.attn", ContextParallel(cp)}});
}

OffloadPolicyVariant detail::shard_offload_policy(const TrainConfig& cfg, const DeviceMesh& mesh) {
  if (cfg.memory.fsdp_offload_dir.empty() || mesh.device_type() == "meta") return OffloadPolicy{};
  return FileOffloadPolicy{cfg.memory.fsdp_offload_dir};
}

FSDPModule detail::shard_and_draw(Training& t, nn::Module& model, const FullyShardOptions& o,
                                  const std::function<FSDPModule()>& shard) {
  const bool offloads = !std::holds_alternative<OffloadPolicy>(o.offload_policy);
  if (offloads) nn::init_parameters(model);
  FSDPModule root = shard();
  nn::init_parameters(model);
  if (offloads) t.offloaded.push_back(root);
  return root;
}

void bring_in_offloaded(Training& t) {
  for (FSDPModule& root : t.offloaded) root.bring_in_offloaded();
}

// Parameters are replicated over cp as over dp, and each rank's gradient is a partial sum
// over its tokens: DDP reduces both at once, deferred and bucketed (as torchtitan folds cp
// into its data-parallel mesh).
std::vector<std::string> detail::gradient_reduce_dims(const TrainConfig& cfg) {
  const ParallelDims dims = cfg.dims();
  if (cfg.mesh.data_parallel == "replicate") return {};
  std::vector<std::string> reduce;
  if (dims.dp > 1) reduce.push_back("dp");
  if (cfg.moe.enabled() && dims.ep > 1) reduce.push_back("ep");  // DDP skips the experts, sharded there
  if (dims.cp > 1)
    for (const std::string& d : dims.cp_dims()) reduce.push_back(d);
  return reduce;
}

// fully_shard over dp, with a one-dim cp as HSDP's replicate dim (fully_shard takes one:
// hybrid's two cp dims reduce inside autograd).
DeviceMesh detail::fully_shard_mesh(const DeviceMesh& stage_mesh, const TrainConfig& cfg) {
  const ParallelDims dims = cfg.dims();
  return dims.cp > 1 && dims.cp_ulysses == 1 ? stage_mesh.submesh({"cp", "dp"}) : stage_mesh["dp"];
}

void detail::apply_precision(nn::Module& model, const TrainConfig& cfg) {
  const PrecisionConfig& p = cfg.low_precision;
  if (p.scaling.empty()) return;
  LowPrecisionConfig c;
  c.scaling = p.scaling;
  c.delayed = p.delayed;
  c.history_len = static_cast<int>(p.history_len);
  c.enable_fsdp_float8_all_gather = p.fsdp_float8_all_gather;
  apply_low_precision(model, c);
}

void detail::apply_activation_checkpointing(nn::Module& model, const TrainConfig& cfg) {
  const MemoryConfig& m = cfg.memory;
  if (m.activation_checkpoint.empty()) return;
  CheckpointOptions o;
  if (m.activation_checkpoint == "selective") o.policy = save_matmuls_and_collectives;
  if (m.activation_checkpoint == "swap")
    o = swap_options(std::make_shared<memory::FileTier>(rank_dir(m.activation_swap_dir)));
  if (m.memory_budget > 0) {
    // Swap with a budget: what it keeps stays in memory, the other products go to the files.
    if (m.activation_checkpoint == "swap") o.policy = save_matmuls_and_collectives;
    o.memory_budget = m.memory_budget;
  }
  o.release_at_next_region = m.release_at_next_region;
  checkpoint_wrapper(model, m.checkpoint_modules, o);
  if (m.chunked_modules.empty()) return;
  CheckpointOptions chunked;
  chunked.token_chunks = static_cast<int>(m.token_chunks);
  checkpoint_wrapper(model, m.chunked_modules, chunked);
}

std::vector<Placement> batch_placements(const DeviceMesh& stage_mesh, bool sequence_sharded) {
  std::vector<Placement> p;
  for (const auto& name : stage_mesh.dim_names())
    p.push_back(name == "dp" || name == "ep"           ? Placement(Shard(0))
                : name.rfind("cp", 0) == 0             ? Placement(Shard(1))  // cp, cp_ring, cp_ulysses
                : name == "tp" && sequence_sharded     ? Placement(Shard(1))
                                                       : Placement(Replicate()));
  return p;
}

namespace {
// fully_shard's shards in files: where the trainer runs it so far. Checked when built, as
// the optimizer's keys are.
void check_fsdp_offload(const TrainConfig& cfg) {
  if (cfg.memory.fsdp_offload_dir.empty()) return;
  const ParallelDims dims = cfg.dims();
  const std::string key = cfg.source + ": memory.fsdp_offload_dir";
  HP_CHECK(shards_data(cfg)) << key << " offloads fully_shard's shards: it needs mesh.data_parallel = \"fsdp\", "
                             << "\"zero1\" or \"zero2\" with dp > 1, not \"" << cfg.mesh.data_parallel
                             << "\" with dp = " << dims.dp;
}

// AdamW, or Muon for the blocks' matrices and AdamW for the rest (get_hyper_optimizer's
// split). With optimizer state or fully_shard's shards in files, a SwapOptimizer streams
// them with one such optimizer per batch.
std::unique_ptr<optim::Optimizer> make_optimizer(const Training& t, const TrainConfig& cfg) {
  optim::AdamWOptions adamw;
  adamw.lr = cfg.train.lr, adamw.weight_decay = cfg.train.weight_decay;
  optim::MuonOptions muon;
  muon.lr = cfg.train.muon_lr, muon.weight_decay = cfg.train.weight_decay;
  muon.ns_dtype = dtype_named(cfg.train.muon_ns_dtype);
  const bool with_muon = cfg.train.optimizer == "muon";
  const std::string& dir = cfg.memory.optimizer_offload_dir;
  if (dir.empty() && !t.offloaded_parameters) {
    if (with_muon) return std::make_unique<optim::ChainedOptimizer>(optim::get_hyper_optimizer(*t.model, muon, adamw));
    return std::make_unique<optim::AdamW>(t.params, adamw);
  }
  memory::OptimizerFactory make = [adamw](std::vector<DTensor*> ps) {
    return std::make_unique<optim::AdamW>(std::move(ps), adamw);
  };
  if (with_muon) make = optim::hyper_optimizer_parts(*t.model, muon, adamw);
  memory::SwapOptimizerOptions so;
  so.batch_bytes = cfg.memory.optimizer_offload_batch_mib << 20;
  so.parameters = t.offloaded_parameters;
  auto tier = std::make_shared<memory::FileTier>(dir.empty() ? rank_dir(cfg.memory.fsdp_offload_dir) + ".optimizer"
                                                             : rank_dir(dir));
  return std::make_unique<memory::SwapOptimizer>(t.params, make, tier, so);
}
}  // namespace

Training build_training(const TrainConfig& cfg, const std::string& device) {
  validate(cfg);
  check_fsdp_offload(cfg);
  // Every mesh dim (size 1 too) and its groups, built up front in the same order on every rank.
  const ParallelDims dims = cfg.dims();
  DeviceMesh mesh = init_device_mesh(device, dims.mesh_shape(), dims.mesh_names());
  Training t{mesh, mesh.submesh(dims.stage_dims())};

  manual_seed(cfg.train.seed);
  if (dims.pp > 1)
    detail::build_pipeline(t, cfg);
  else
    build_whole_model(t, cfg);
  t.params = t.model->parameters();
  if (!t.offloaded.empty()) t.offloaded_parameters = offloaded_parameters(t.offloaded);
  t.opt = make_optimizer(t, cfg);
  t.base_lr = t.opt->lr();

  t.rows = batch_placements(t.stage_mesh);
  t.global = {cfg.train.batch, cfg.train.seq};
  // A pipeline's first and last stages take the whole batch and split it into microbatches
  // whose rows then go over dp (mesh_stage); without one each dp rank reads its own rows.
  // Rows go over dp and ep in mesh order, as the DTensor's Shard(0) on both splits them.
  if (!t.pipeline) {
    t.data_rank = 0, t.data_size = dims.data_parallel_size();
    for (const auto& name : t.stage_mesh.dim_names())
      if (name == "dp" || name == "ep") t.data_rank = t.data_rank * dims.size(name) + t.stage_mesh.local_rank(name);
  }
  if (dims.cp > 1) {
    t.cp_sizes.clear();
    for (const std::string& name : dims.cp_dims()) {
      t.cp_rank = t.cp_rank * t.stage_mesh.size(t.stage_mesh.shape().dim_index(name)) + t.stage_mesh.local_rank(name);
      t.cp_sizes.push_back(t.stage_mesh.size(t.stage_mesh.shape().dim_index(name)));
    }
  }
  return t;
}

StepOutput train_step(Training& t, const TrainConfig& cfg, const at::Tensor& inputs, const at::Tensor& targets,
                      double lr, const std::function<void()>& before_update) {
  t.opt->set_lr(lr);
  StepOutput out;
  auto phase = [](const char* name) { return trace::Span("compute", trace::enabled() ? name : ""); };
  if (t.pipeline) {
    out.loss = t.pipeline->step(inputs, targets);
    out.bubble = t.pipeline->last_stats().idle_fraction();
    if (t.stage_aux_loss) {  // the loss logged is the one pp = 1 would log: every stage's share added
      at::Tensor aux = comm::all_reduce_(t.stage_aux_loss->clone(), *t.other_stages);
      t.stage_aux_loss->zero_();
      out.loss = out.loss + aux.to(at::kDouble);
    }
  } else {
    DTensor ids = DTensor::from_local(inputs, t.stage_mesh, t.rows, t.global);
    DTensor tgt = DTensor::from_local(targets, t.stage_mesh, t.rows, t.global);
    const DTensor loss = [&] {
      auto span = phase("forward");
      return t.moe_llama ? t.moe_llama->loss(ids, tgt) : t.llama->loss(ids, tgt);
    }();
    {
      auto span = phase("backward");
      loss.to_local().backward();
    }
    out.loss = loss.to_local();
  }
  auto span = phase("optimizer");
  // Clipping streams offloaded gradients in and out, one parameter at a time.
  if (cfg.train.grad_clip > 0)
    out.grad_norm =
        optim::clip_grad_norm_(t.params, cfg.train.grad_clip, t.other_stages, t.offloaded_parameters.get());
  if (before_update) before_update();
  t.opt->step();
  t.opt->zero_grad();
  if (cfg.moe.enabled()) {
    out.expert_load = nn::update_expert_bias(*t.model);  // this rank's stages' blocks with pp > 1
    if (t.pipeline) {
      at::Tensor worst = at::full({1}, out.expert_load, at::kDouble);
      out.expert_load = comm::all_reduce_(worst, *t.other_stages, ReduceOp::Max).item<double>();
    }
  }
  return out;
}

}  // namespace hp::train
