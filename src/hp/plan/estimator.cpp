#include "hp/plan/estimator.h"

#include <algorithm>

#include "hp/base/error.h"
#include "hp/plan/cp_traffic.h"
#include "hp/plan/pipeline_stages.h"
#include "hp/plan/rank_groups.h"

namespace hp::plan {

namespace {

// What one pipeline rank costs per microbatch and per step.
struct StageTime {
  double compute = 0, recompute = 0, tp = 0, cp = 0, ep = 0, zero = 0;  // per microbatch
  double dp = 0;                                                        // per step, exposed
  double per_microbatch() const { return compute + tp + cp + ep + zero; }
};

PipelineShape pipeline_shape(const Strategy& s) {
  PipelineShape p;
  p.schedule = s.schedule;
  p.pp = s.pp;
  p.microbatches = s.microbatches;
  p.vpp = s.virtual_stages;
  return p;
}

// Extra forward work per forward of `dense` and `moe` layers (pipeline_profile.h's r).
double recompute_share(Recompute r, const ModelDesc& m, double dense, double moe, const EstimatorOptions& o) {
  if (!recomputes_whole_layers(r)) return r == Recompute::Selective ? o.selective_recompute_cost : 0;
  // One more forward, less the products only the residual add reads.
  const double forward = dense * layer_forward_flops_per_token(m, false) + moe * layer_forward_flops_per_token(m, true);
  const double again =
      dense * recomputed_layer_flops_per_token(m, false) + moe * recomputed_layer_flops_per_token(m, true);
  const double share = forward > 0 ? again / forward : 1;
  // A chunked MLP runs no more forwards (the layer's recompute stands in for it), in smaller pieces.
  return r == Recompute::FullChunked ? share + o.chunked_recompute_cost : share;
}

void add_item(std::vector<CommItem>& items, const char* name, Collective kind, GroupKind g, RankGroups& groups,
              double bytes, double calls, double exposed_share, size_t levels) {
  if (groups.size(g) <= 1 || bytes <= 0 || calls <= 0) return;
  const CollectiveCost& c = groups.cost(g, kind, bytes);
  CommItem it;
  it.name = name;
  it.kind = kind;
  it.group = to_string(g);
  it.group_size = groups.size(g);
  it.bytes = bytes;
  it.calls = calls;
  it.seconds = c.seconds * calls;
  it.exposed = it.seconds * exposed_share;
  it.bytes_per_level.assign(levels, 0.0);
  // cost() sums over the group's ranks, except a send/recv that is a single transfer.
  const double per_rank = kind == Collective::SendRecv ? 1.0 : 1.0 / double(it.group_size);
  for (size_t l = 0; l < c.bytes_per_level.size() && l < levels; ++l)
    it.bytes_per_level[l] = c.bytes_per_level[l] * per_rank * calls;
  items.push_back(std::move(it));
}

}  // namespace

Estimator::Estimator(ModelDesc model, ClusterSpec cluster, EstimatorOptions options)
    : model_(std::move(model)), cluster_(std::move(cluster)), options_(options) {
  model_.validate();
  costs_ = std::make_unique<CostCache>(cluster_.topology);
}

Estimator::~Estimator() = default;

double Estimator::usable_memory() const {
  return cluster_.device.memory_GiB * double(1ull << 30) * options_.usable_memory_fraction;
}

RankGroups& Estimator::groups_for(const Strategy& s) {
  std::vector<int64_t> dims = {s.pp, s.dp, s.ep, s.cp, s.tp, s.cp_ulysses};
  if (!groups_ || dims != groups_dims_) {
    groups_ = std::make_unique<RankGroups>(*costs_, s);
    groups_dims_ = dims;
  }
  return *groups_;
}

std::vector<StageContents> Estimator::stages_for(const Strategy& s) const {
  const int64_t chunks = s.pp * s.virtual_stages;
  auto it = splits_.find(chunks);
  if (it == splits_.end()) it = splits_.emplace(chunks, balance_stages(model_, chunks)).first;
  return place_chunks(model_, it->second, s.pp, s.virtual_stages, s.schedule);
}

MemoryBreakdown Estimator::memory(const Strategy& s) const {
  const std::vector<MemoryBreakdown> stages = stage_memories(s);
  MemoryBreakdown worst = stages.front();
  for (const MemoryBreakdown& mem : stages)
    if (mem.total() > worst.total()) worst = mem;
  return worst;
}

std::vector<MemoryBreakdown> Estimator::stage_memories(const Strategy& s) const {
  HP_CHECK(s.dp > 0 && s.micro_batch > 0 && s.microbatches > 0)
      << "Estimator: strategy " << to_string(s) << " is not resolved; call resolve_strategy first";
  const std::vector<StageContents> stages = stages_for(s);
  const std::vector<double>& inflight = pipelines_.inflight(pipeline_shape(s));
  std::vector<MemoryBreakdown> out;
  for (int64_t i = 0; i < s.pp; ++i)
    out.push_back(stage_memory(model_, s, stages[i], i, inflight[i], options_.numerics));
  return out;
}

Estimate Estimator::estimate(const Strategy& s) {
  const ModelDesc& m = model_;
  Estimate e;
  e.strategy = s;
  e.memory = memory(s);
  e.usable_memory = usable_memory();
  e.fits = e.memory.total() <= e.usable_memory;
  for (const auto& l : cluster_.topology.levels()) e.level_names.push_back(l.name);
  const size_t levels = e.level_names.size();

  RankGroups& groups = groups_for(s);
  const Numerics& nm = options_.numerics;
  const double rate = cluster_.device.tflops * 1e12 * options_.compute_efficiency;
  const double t = s.tp, mb = s.microbatches;
  const double tokens = double(s.micro_batch) * m.seq_len / s.cp;  // per rank per microbatch, before SP
  const bool full = recomputes_whole_layers(s.recompute);

  // Per-layer, per-microbatch communication, the same on every stage.
  const double tp_bytes = tokens * m.hidden * nm.activation_bytes;
  const double tp_calls = full ? 6 : 4;  // each of all-gather and reduce-scatter: 2 fwd, 2 bwd, 2 recompute
  double tp_layer = 0;
  if (s.tp > 1)
    tp_layer = tp_calls * (groups.cost(GroupKind::TP, Collective::AllGather, tp_bytes).seconds +
                           groups.cost(GroupKind::TP, Collective::ReduceScatter, tp_bytes).seconds);
  // Context parallelism: the calls of the strategy's attention mode, per layer.
  CpAttentionShape cp_shape;
  cp_shape.tokens = double(s.micro_batch) * m.seq_len;
  cp_shape.heads = m.heads / s.tp;
  cp_shape.kv_heads = std::max<int64_t>(1, m.kv_heads / s.tp);
  cp_shape.head_dim = m.head_size();
  cp_shape.element_bytes = nm.activation_bytes;
  cp_shape.cp = s.cp, cp_shape.ulysses = s.cp_ulysses;
  const std::vector<CpCall> cp_calls = cp_attention_calls(s.cp_mode, cp_shape);
  auto cp_group = [](const CpCall& c) { return c.inner ? GroupKind::CpUlysses : GroupKind::CpRing; };
  auto cp_cost_bytes = [&](const CpCall& c) {  // cost() takes an all-gather's output, a rank's input otherwise
    return c.op == Collective::AllGather ? c.bytes * double(groups.size(cp_group(c))) : c.bytes;
  };
  auto cp_calls_per_layer = [&](const CpCall& c) { return c.forward * (full ? 2 : 1) + c.backward; };
  double cp_beside = 0, cp_blocking = 0;  // per layer: beside attention compute, or in its way
  for (const CpCall& c : cp_calls)
    (c.beside_attention ? cp_beside : cp_blocking) +=
        cp_calls_per_layer(c) * groups.cost(cp_group(c), c.op, cp_cost_bytes(c)).seconds;
  const double attn_layer = tokens / t * attention_flops_per_token(m) / s.cp * (full ? 4 : 3) / rate;
  const bool overlap = options_.overlap_communication;
  const double cp_beside_exposed = overlap ? std::max(0.0, cp_beside - attn_layer) : cp_beside;
  const double cp_layer_exposed = cp_blocking + cp_beside_exposed;
  const double ep_bytes = tokens / t * m.top_k * m.hidden * nm.activation_bytes;
  const double ep_calls = full ? 6 : 4;  // dispatch + combine: fwd, bwd, recompute
  double ep_layer = 0;
  if (s.ep > 1) ep_layer = ep_calls * groups.cost(GroupKind::EP, Collective::AllToAll, ep_bytes).seconds;
  const double pp_bytes = tokens / t * m.hidden * nm.activation_bytes;

  auto stages = stages_for(s);
  auto stage_time = [&](const StageContents& st) {
    StageTime r;
    double fwd = st.dense_layers * layer_forward_flops_per_token(m, false) +
                 st.moe_layers * layer_forward_flops_per_token(m, true);
    const double extra = fwd * recompute_share(s.recompute, m, double(st.dense_layers), double(st.moe_layers), options_);
    if (st.head) fwd += head_forward_flops_per_token(m);
    const double scale = tokens / t / rate;
    r.compute = (3 * fwd + extra) * scale;
    r.recompute = extra * scale;
    r.tp = st.layers() * tp_layer;
    r.cp = st.layers() * cp_layer_exposed;
    r.ep = st.moe_layers * ep_layer;
    const StageParams p = stage_params(m, s, st);
    // Data-parallel collectives of one stage: all-gathers of parameters, reduce-scatters or
    // all-reduces of gradients, dense and expert, each over its own group.
    auto data = [&](Collective op, bool grads) {
      const double bytes = grads ? nm.grad_bytes : nm.param_bytes;
      double c = 0;
      if (groups.size(GroupKind::DenseGrad) > 1 && p.dense > 0)
        c += groups.cost(GroupKind::DenseGrad, op, p.dense * bytes).seconds;
      if (groups.size(GroupKind::ExpertGrad) > 1 && p.expert > 0)
        c += groups.cost(GroupKind::ExpertGrad, op, p.expert * bytes).seconds;
      return c;
    };
    auto exposed = [&](double c, double behind) { return overlap ? std::max(0.0, c - behind) : c; };
    const double forward = r.compute / 3, backward = r.compute * 2 / 3;
    if (s.zero == 3) {  // gathered for every forward and backward, reduced every microbatch
      r.zero = exposed(2 * data(Collective::AllGather, false) + data(Collective::ReduceScatter, true), r.compute);
    } else if (s.zero == 2) {  // gathered once behind the first forward, reduced every microbatch
      r.dp = exposed(data(Collective::AllGather, false), forward);
      r.zero = exposed(data(Collective::ReduceScatter, true), backward);
    } else if (s.zero == 1) {  // gathered once, reduced once behind the last backward
      r.dp = exposed(data(Collective::AllGather, false), forward) +
             exposed(data(Collective::ReduceScatter, true), backward);
    } else {
      r.dp = exposed(data(Collective::AllReduce, true), backward);  // behind the last backward
    }
    return r;
  };

  // Stages with the same contents cost the same; most pipelines have few kinds.
  std::vector<StageTime> times(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    size_t j = 0;
    for (; j < i; ++j) {
      const auto &a = stages[i], &b = stages[j];
      if (a.dense_layers == b.dense_layers && a.moe_layers == b.moe_layers && a.embedding == b.embedding &&
          a.head == b.head)
        break;
    }
    times[i] = j < i ? times[j] : stage_time(stages[i]);
  }
  size_t slow = 0;
  double dp_exposed = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    if (times[i].per_microbatch() > times[slow].per_microbatch()) slow = i;
    dp_exposed = std::max(dp_exposed, times[i].dp);
  }
  const StageTime& st = times[slow];
  e.slowest_stage = static_cast<int64_t>(slow);
  e.bubble_fraction = pipelines_.bubble_fraction(
      pipeline_shape(s),
      recompute_share(s.recompute, m, double(m.layers - m.moe_layers()), double(m.moe_layers()), options_));
  const double busy = mb * st.per_microbatch();
  const double pipeline = busy / (1 - e.bubble_fraction);
  double pp_send = 0;
  if (s.pp > 1) pp_send = groups.cost(GroupKind::PP, Collective::SendRecv, pp_bytes).seconds;
  TimeBreakdown& tb = e.time;
  tb.compute = mb * st.compute;
  tb.recompute = mb * st.recompute;
  tb.tp = mb * st.tp;
  tb.cp = mb * st.cp;
  tb.ep = mb * st.ep;
  tb.zero = mb * st.zero;
  tb.bubble = pipeline - busy;
  tb.pp = 2 * double(s.pp - 1) * pp_send;  // fill and drain; steady-state sends overlap compute
  tb.dp = dp_exposed;
  tb.total = pipeline + tb.pp + tb.dp;

  // Itemized communication of the slowest rank.
  const StageContents& ss = stages[slow];
  const double L = double(ss.layers());
  const StageParams p = stage_params(m, s, ss);
  auto& items = e.comm;
  add_item(items, "tp all_gather (SP)", Collective::AllGather, GroupKind::TP, groups, tp_bytes, tp_calls * L * mb, 1,
           levels);
  add_item(items, "tp reduce_scatter (SP)", Collective::ReduceScatter, GroupKind::TP, groups, tp_bytes,
           tp_calls * L * mb, 1, levels);
  const double cp_beside_share = cp_beside > 0 ? cp_beside_exposed / cp_beside : 0;
  for (const CpCall& c : cp_calls)
    add_item(items, ("cp " + c.what).c_str(), c.op, cp_group(c), groups, cp_cost_bytes(c),
             cp_calls_per_layer(c) * L * mb, c.beside_attention ? cp_beside_share : 1, levels);
  add_item(items, "ep all_to_all", Collective::AllToAll, GroupKind::EP, groups, ep_bytes,
           ep_calls * double(ss.moe_layers) * mb, 1, levels);
  const double sends = 2 * mb * double(s.virtual_stages);
  add_item(items, "pp send/recv", Collective::SendRecv, GroupKind::PP, groups, pp_bytes, sends,
           sends > 0 ? tb.pp / (sends * std::max(pp_send, 1e-30)) : 0, levels);
  const size_t first_data_item = items.size();
  // Per step: ZeRO-3 gathers twice and reduces once per microbatch, ZeRO-2 gathers once and
  // reduces per microbatch, ZeRO-1 does each once, DDP all-reduces once.
  const double gathers = s.zero == 3 ? 2 * mb : s.zero > 0 ? 1 : 0;
  const double reductions = s.zero >= 2 ? mb : 1;
  if (s.zero > 0) {
    add_item(items, "zero all_gather params", Collective::AllGather, GroupKind::DenseGrad, groups,
             p.dense * nm.param_bytes, gathers, 0, levels);
    add_item(items, "zero reduce_scatter grads", Collective::ReduceScatter, GroupKind::DenseGrad, groups,
             p.dense * nm.grad_bytes, reductions, 0, levels);
    add_item(items, "zero all_gather experts", Collective::AllGather, GroupKind::ExpertGrad, groups,
             p.expert * nm.param_bytes, gathers, 0, levels);
    add_item(items, "zero reduce_scatter expert grads", Collective::ReduceScatter, GroupKind::ExpertGrad, groups,
             p.expert * nm.grad_bytes, reductions, 0, levels);
  } else {
    add_item(items, "dp grad all_reduce", Collective::AllReduce, GroupKind::DenseGrad, groups, p.dense * nm.grad_bytes,
             1, 0, levels);
    add_item(items, "dp expert grad all_reduce", Collective::AllReduce, GroupKind::ExpertGrad, groups,
             p.expert * nm.grad_bytes, 1, 0, levels);
  }
  // Share this rank's exposed data-parallel time over its items by their length.
  double data_seconds = 0;
  for (size_t i = first_data_item; i < items.size(); ++i) data_seconds += items[i].seconds;
  const double data_exposed = mb * st.zero + st.dp;
  for (size_t i = first_data_item; i < items.size(); ++i)
    items[i].exposed = data_seconds > 0 ? items[i].seconds * data_exposed / data_seconds : 0;
  e.comm_bytes_per_level.assign(levels, 0.0);
  for (const auto& it : items)
    for (size_t l = 0; l < levels; ++l) e.comm_bytes_per_level[l] += it.bytes_per_level[l];

  const double step_tokens = double(s.global_batch) * m.seq_len;
  e.tokens_per_second = step_tokens / tb.total;
  e.model_flops = 3 * forward_flops_per_token(m) * step_tokens;
  e.mfu = e.model_flops / (tb.total * double(s.devices()) * cluster_.device.tflops * 1e12);
  return e;
}

Estimate estimate(const ModelDesc& m, const ClusterSpec& c, const Strategy& s, int64_t devices,
                  const EstimatorOptions& o) {
  Strategy r = resolve_strategy(s, m, devices > 0 ? devices : c.num_devices());
  Estimator est(m, c, o);
  return est.estimate(r);
}

}  // namespace hp::plan
