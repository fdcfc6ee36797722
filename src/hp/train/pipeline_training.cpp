// The trainer's pipeline stages: the Llama (or MoE Llama) cut into chunks from outside the
// model, each a mesh stage on the ranks of one pp coordinate, with tensor, context and
// expert parallelism and data parallelism (ddp or fully_shard) inside it, driven by the
// configured schedule. Every stage mesh has one shape, so each rank hands its piece of
// an activation, in the layout the next chunk takes it in, to the rank at its place in
// the next mesh (MeshStageOptions::output_placements); the batch arrives whole, in the cp
// layout's order, and the first stage takes its share.
// A MoE layer's auxiliary loss rides on its output (nn::MoE::set_aux_loss_carry): each
// stage's backward seeds it, times 1 / microbatches as the loss is, so the loss is the
// mean over microbatches of their cross-entropy plus auxiliary loss (with one microbatch,
// the pp = 1 loss). Expert all-to-alls stay on the stage's ep ranks, which run the same
// schedule; each stage updates its own routers' biases after the step.
#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm/world.h"
#include "hp/pipeline/mesh_stage.h"
#include "hp/plan/stage_split.h"
#include "hp/schedule/generators.h"
#include "hp/train/plan_bridge.h"
#include "hp/train/train_step.h"

namespace hp::train::detail {
namespace {

// Blocks per chunk: the config's split, else the planner's balanced one (the slowest
// chunk as fast as it can be, the head's work counted on the last).
std::vector<int64_t> chunk_layers(const TrainConfig& cfg, int chunks) {
  if (!cfg.pipeline.split.empty()) return cfg.pipeline.split;
  return plan::balance_stages(model_desc_of(cfg), chunks).layers;
}

// Per pp coordinate, the ranks of its stage mesh: schedule rank r runs on rank_meshes[r].
std::vector<MeshShape> stage_meshes(const DeviceMesh& mesh) {
  const MeshShape& shape = mesh.shape();
  const int pp_dim = shape.dim_index("pp");
  std::vector<int> others;
  for (int d = 0; d < shape.ndim(); ++d)
    if (d != pp_dim) others.push_back(d);
  std::vector<MeshShape> meshes;
  for (int64_t r = 0; r < shape.dim_size(pp_dim); ++r) {
    std::vector<int64_t> coord(shape.ndim(), 0);
    coord[pp_dim] = r;
    meshes.push_back(shape.submesh(shape.rank_at(coord), others));
  }
  return meshes;
}

}  // namespace

void build_pipeline(Training& t, const TrainConfig& cfg) {
  const DeviceMesh& sm = t.stage_mesh;
  const ParallelDims dims = cfg.dims();
  const int pp = static_cast<int>(dims.pp);
  const int pp_rank = static_cast<int>(t.mesh.local_rank("pp"));
  schedule::Schedule sched = schedule::make_schedule(cfg.pipeline.schedule, pp, static_cast<int>(cfg.microbatches()),
                                                     static_cast<int>(cfg.pipeline.virtual_stages));
  const int chunks = sched.num_stages;
  const std::vector<int64_t> layers = chunk_layers(cfg, chunks);

  // The whole model on every stage mesh from the same seed, deferred (nn::no_init_parameters),
  // so each stage draws the values one process would have; what no stage of this rank takes
  // never gets storage.
  const bool moe = cfg.moe.enabled();
  std::shared_ptr<nn::Module> whole;
  if (moe) {
    whole = build_moe_llama(cfg, sm);
  } else {
    std::shared_ptr<nn::Llama> llama;
    {
      auto deferred = nn::no_init_parameters();  // each stage draws its own shards below
      llama = std::make_shared<nn::Llama>(cfg.model, sm);
    }
    if (dims.tp > 1) parallelize_llama(*llama, sm["tp"], {cfg.mesh.sequence_parallel, /*loss_parallel=*/true, cfg.mesh.async_tp});
    apply_context_parallel(*llama, sm, cfg);
    apply_precision(*llama, cfg);
    apply_activation_checkpointing(*llama, cfg);
    whole = llama;
  }
  const double loss_scale = 1.0 / double(cfg.microbatches());
  // Every activation between chunks: a microbatch [rows, seq, dim], in this layout.
  const std::vector<int64_t> activation_shape{cfg.train.batch / cfg.microbatches(), cfg.train.seq, cfg.model.dim};
  const std::vector<Placement> between_chunks = batch_placements(sm, cfg.mesh.sequence_parallel);
  if (moe) t.stage_aux_loss = std::make_shared<at::Tensor>(at::zeros({}, tensor_options(sm)));
  const bool shards = dims.data_parallel_size() > 1;  // what fully_shard has to split: dp's ranks, and ep's with MoE
  const std::vector<std::string> reduce_dims = gradient_reduce_dims(cfg);
  auto group = comm::current_world()->world_group(t.mesh.device_type());
  auto mine = std::make_shared<nn::Sequential>();
  std::vector<pipeline::PipelineStage> stages;
  for (int c : sched.stages_of(pp_rank)) {
    std::shared_ptr<nn::Sequential> stage = llama_stage(*whole, layers, c);
    for (const auto& [name, m] : stage->named_children()) mine->append(name, m), t.chunk_of[name] = c;

    pipeline::MeshStageOptions o;
    o.stage_index = c;
    o.num_stages = chunks;
    // Token ids (chunk 0) or activations between blocks; each rank hands on its piece of
    // an activation in the layout the next chunk takes it in (all stage meshes have one
    // shape).
    o.input_placements = batch_placements(sm, cfg.mesh.sequence_parallel && c > 0);
    o.output_placements = between_chunks;
    o.activation_shape = activation_shape;
    if (shards && cfg.mesh.zero_stage() > 0) {
      const int zero = cfg.mesh.zero_stage();
      FullyShardOptions so = zero_stage_options(zero);
      so.offload_policy = shard_offload_policy(cfg, sm);
      // MoE: as pp = 1, routed experts in their own unit over dp, the rest over dp x ep.
      const auto [shard_mesh, expert_mesh] =
          moe ? moe_shard_meshes(sm) : std::pair<DeviceMesh, DeviceMesh>{fully_shard_mesh(sm, cfg), fully_shard_mesh(sm, cfg)};
      FSDPModule unit = shard_and_draw(t, *stage, so, [&, &shard_mesh = shard_mesh, &expert_mesh = expert_mesh] {
        for (const auto& [name, m] : stage->named_modules())
          if (name_matches("layers.*.moe.experts", name)) fully_shard(*m, expert_mesh, so);
        for (const auto& [name, m] : stage->named_children())
          if (name.rfind("layers.", 0) == 0) fully_shard(*m, shard_mesh, so);
        return fully_shard(*stage, shard_mesh, so);
      });
      o.set_requires_gradient_sync = [unit, zero](bool last) mutable { prepare_zero_backward(unit, zero, last); };
    } else {
      nn::init_parameters(*stage);
      if (!reduce_dims.empty()) {
        t.ddp.push_back(std::make_unique<DistributedDataParallel>(*stage, sm.submesh(reduce_dims)));
        DistributedDataParallel* d = t.ddp.back().get();
        o.set_requires_gradient_sync = [d](bool on) { d->set_requires_gradient_sync(on); };
        o.sync_in_weight_backward = true;  // its hooks fire as W accumulates
      }
    }
    for (nn::MoE* moe : nn::moe_layers(*stage)) moe->set_aux_loss_carry(loss_scale);
    o.forward = [stage, aux_sum = t.stage_aux_loss, loss_scale](const DTensor& x) {
      DTensor y = (*stage)(x);
      std::optional<DTensor> aux = aux_sum ? nn::moe_aux_loss(*stage) : std::nullopt;
      if (aux) *aux_sum += aux->to_local().detach() * loss_scale;  // the value: its gradient rides on the layers' outputs
      return y;
    };
    o.parameters = stage->parameters();
    if (c == chunks - 1) {
      const std::vector<Placement> rows = batch_placements(sm);
      o.loss = [sm, rows](const DTensor& logits, const at::Tensor& target) {
        ShardSpec spec = make_spec(target.sizes().vec(), target.scalar_type(), sm, rows);
        DTensor tgt(pipeline::local_piece(target, spec, sm.coordinate()), sm, spec);
        return cross_entropy(logits, tgt);  // [rows, seq, vocab]: a cp-sharded sequence stays sharded
      };
    }
    o.group = group;
    stages.push_back(pipeline::mesh_stage(sm, std::move(o)));
  }
  t.pipeline = std::make_unique<pipeline::PipelineRuntime>(std::move(stages), std::move(sched), stage_meshes(t.mesh));
  // This rank's piece of every activation between chunks has one shape, in float32, so
  // shapes need not travel: one message fewer each, and a dry-run's fake world works.
  const std::vector<int64_t> piece =
      make_spec(activation_shape, at::kFloat, sm, between_chunks).local_shape(sm.coordinate());
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::Device(t.mesh.device_type()));
  t.pipeline->set_static_shapes([piece, options](int, int) { return at::empty(piece, options); });
  t.model = mine;
  t.other_stages = &t.mesh.group("pp");
}

}  // namespace hp::train::detail
