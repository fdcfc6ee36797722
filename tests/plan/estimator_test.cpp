#include <gtest/gtest.h>

#include "hp/plan/cp_traffic.h"
#include "hp/plan/estimator.h"
#include "hp/plan/flops.h"
#include "hp/plan/pipeline_profile.h"

using namespace hp::plan;

namespace {

Estimate run(const std::string& model, const std::string& topo, const std::string& strategy, int64_t devices = 0) {
  return estimate(model_preset(model), load_cluster(topo), parse_strategy(strategy), devices);
}

}  // namespace

TEST(Estimator, MoreTpLessParameterMemory) {
  double last = 1e30;
  for (int tp : {1, 2, 4, 8}) {
    Estimate e = run("llama3-8b", "server-8", "tp=" + std::to_string(tp));
    EXPECT_LT(e.memory.params, last) << "tp=" << tp;
    last = e.memory.params;
  }
}

TEST(Estimator, RecomputeTradesMemoryForTime) {
  Estimate none = run("llama3-8b", "server-8", "tp=4,mbs=2,recompute=none");
  Estimate sel = run("llama3-8b", "server-8", "tp=4,mbs=2,recompute=selective");
  Estimate full = run("llama3-8b", "server-8", "tp=4,mbs=2,recompute=full");
  EXPECT_GT(none.memory.activations, sel.memory.activations);
  EXPECT_GT(sel.memory.activations, full.memory.activations);
  EXPECT_LT(none.time.total, sel.time.total);
  EXPECT_LT(sel.time.total, full.time.total);
  // Full recompute runs the layers' forward again, less each MLP's down projection, which
  // only the residual add reads: under 4/3 of the compute.
  const ModelDesc m = model_preset("llama3-8b");
  const double again = double(m.layers) * recomputed_layer_flops_per_token(m, false);
  EXPECT_LT(again, double(m.layers) * layer_forward_flops_per_token(m, false));
  EXPECT_NEAR(full.time.compute / none.time.compute, 1 + again / (3 * forward_flops_per_token(m)), 1e-9);
  EXPECT_LT(full.time.compute / none.time.compute, 4.0 / 3.0);
}

TEST(Estimator, ComputeMatchesSixNDWithoutParallelOverheads) {
  ModelDesc m = model_preset("llama3-8b");
  ClusterSpec c = load_cluster("server-8");
  Estimate e = estimate(m, c, parse_strategy("dp=1,mbs=1,mb=1"), 1);
  const double tokens = double(m.seq_len);
  // 6 * params * tokens is the dense part; attention and the embedding lookup differ a little.
  const double six_nd = 6.0 * double(count_params(m).total) * tokens;
  const double rate = c.device.tflops * 1e12 * EstimatorOptions{}.compute_efficiency;
  EXPECT_NEAR(e.time.compute * rate / six_nd, 1.0, 0.1);
  EXPECT_DOUBLE_EQ(e.time.total, e.time.compute);  // one device: nothing to communicate
  EXPECT_NEAR(e.mfu, EstimatorOptions{}.compute_efficiency, 1e-9);
}

TEST(Estimator, TpGroupStaysInTheServer) {
  Estimate e = run("llama3-70b", "cluster-16k", "tp=8,pp=8,mb=32", 1024);
  ASSERT_EQ(e.level_names.size(), 3u);
  for (const auto& it : e.comm) {
    if (it.group == "tp") {
      EXPECT_GT(it.bytes_per_level[0], 0) << it.name;
      EXPECT_EQ(it.bytes_per_level[1], 0) << it.name;
      EXPECT_EQ(it.bytes_per_level[2], 0) << it.name;
    }
  }
  // The data-parallel reduce crosses servers; pp stage neighbours are 128 ranks apart.
  EXPECT_GT(e.comm_bytes_per_level[1], 0);
}

TEST(Estimator, BubbleAndInflightComeFromTheSimulatedSchedule) {
  Estimate e = run("llama3-8b", "server-8", "dp=1,pp=8,mb=16,schedule=1f1b");
  EXPECT_DOUBLE_EQ(e.bubble_fraction, pipeline_bubble_fraction({"1f1b", 8, 16, 1}, 0));
  EXPECT_GT(e.time.bubble, 0);
  Estimate zb = run("llama3-8b", "server-8", "dp=1,pp=8,mb=16,schedule=zb-h1");
  EXPECT_LT(zb.time.bubble, e.time.bubble);
  Estimate gp = run("llama3-8b", "server-8", "dp=1,pp=8,mb=16,schedule=gpipe");
  EXPECT_GT(gp.memory.activations, e.memory.activations);  // all 16 microbatches alive
  // Recompute enters as the share of extra forward work in I (and so B): full adds one
  // forward less the down projections.
  Estimate full = run("llama3-8b", "server-8", "dp=1,pp=4,mb=8,schedule=zb-h1,recompute=full", 4);
  const ModelDesc m = model_preset("llama3-8b");
  const double share = recomputed_layer_flops_per_token(m, false) / layer_forward_flops_per_token(m, false);
  EXPECT_DOUBLE_EQ(full.bubble_fraction, pipeline_bubble_fraction({"zb-h1", 4, 8, 1}, share));
  Estimate sel = run("llama3-8b", "server-8", "dp=1,pp=4,mb=8,schedule=zb-h1,recompute=selective", 4);
  EXPECT_DOUBLE_EQ(sel.bubble_fraction,
                   pipeline_bubble_fraction({"zb-h1", 4, 8, 1}, EstimatorOptions{}.selective_recompute_cost));
  Estimate none = run("llama3-8b", "server-8", "dp=1,pp=4,mb=8,schedule=zb-h1,recompute=none", 4);
  EXPECT_NEAR(none.bubble_fraction, 0.111, 5e-4);
  // ZB-H1 keeps p microbatches alive on every rank: the last rank's activations are p
  // times one microbatch's, as for rank 0 (1F1B's last rank keeps one).
  Estimator est(m, load_cluster("server-8"));
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    const Strategy s = resolve_strategy(parse_strategy(std::string("dp=1,pp=4,mb=8,schedule=") + schedule), m, 4);
    const std::vector<StageContents> stages = split_stages(m, 4, 1, schedule);
    const std::vector<double> inflight = inflight_microbatches({schedule, 4, 8, 1});
    EXPECT_DOUBLE_EQ(stage_memory(m, s, stages[3], 3, inflight[3]).activations,
                     inflight[3] * stage_memory(m, s, stages[3], 3, 1).activations)
        << schedule;
    EXPECT_EQ(inflight[3], std::string(schedule) == "zb-h1" ? 4 : 1);
  }
}

TEST(Estimator, MoeUsesAllToAllOnEp) {
  Estimate e = run("deepseek-v3-like", "cluster-16k", "tp=8,pp=16,ep=8,mb=32", 2048);
  bool a2a = false;
  for (const auto& it : e.comm) a2a |= (it.kind == hp::Collective::AllToAll && it.group_size == 8);
  EXPECT_TRUE(a2a);
  EXPECT_GT(e.time.ep, 0);
}

TEST(Estimator, FsdpFitsWhatReplicationCannot) {
  Estimate dp = run("llama3-8b", "server-8", "dp=8,recompute=full");
  Estimate fsdp = run("llama3-8b", "server-8", "dp=8,fsdp=1,recompute=full");
  EXPECT_FALSE(dp.fits);  // 16 bytes per parameter on every rank: 128 GB
  EXPECT_TRUE(fsdp.fits);
}

// Per step of m microbatches: ZeRO-1 gathers and reduces once, ZeRO-2 reduces m times,
// ZeRO-3 also gathers 2m times; DDP all-reduces once.
TEST(Estimator, ZeroStagesCountTheirCollectives) {
  const int64_t mb = 16;
  struct Want {
    const char* zero;
    double gathers, reductions, all_reduces;
  };
  for (Want w : {Want{"0", 0, 0, 1}, Want{"1", 1, 1, 0}, Want{"2", 1, mb, 0}, Want{"3", 2 * mb, mb, 0}}) {
    Estimate e = run("llama3-8b", "superpod-384", std::string("dp=12,tp=8,pp=4,mb=16,zero=") + w.zero, 384);
    double gathers = 0, reductions = 0, all_reduces = 0;
    for (const auto& it : e.comm) {
      if (it.name == "zero all_gather params") gathers = it.calls;
      if (it.name == "zero reduce_scatter grads") reductions = it.calls;
      if (it.name == "dp grad all_reduce") all_reduces = it.calls;
    }
    EXPECT_EQ(gathers, w.gathers) << "zero=" << w.zero;
    EXPECT_EQ(reductions, w.reductions) << "zero=" << w.zero;
    EXPECT_EQ(all_reduces, w.all_reduces) << "zero=" << w.zero;
  }
  // Fewer collectives per step: ZeRO-1 spends less time on data parallelism than ZeRO-3,
  // and more memory.
  auto data_seconds = [](const Estimate& e) {
    double s = 0;
    for (const auto& it : e.comm) s += it.group == "dp*ep*cp" ? it.seconds : 0;
    return s;
  };
  Estimate z1 = run("llama3-8b", "superpod-384", "dp=12,tp=8,pp=4,mb=16,zero=1", 384);
  Estimate z3 = run("llama3-8b", "superpod-384", "dp=12,tp=8,pp=4,mb=16,zero=3", 384);
  EXPECT_LT(data_seconds(z1), data_seconds(z3) / 10);
  EXPECT_LE(z1.time.dp + z1.time.zero, z3.time.dp + z3.time.zero);
  EXPECT_GT(z1.memory.total(), z3.memory.total());
}

TEST(Estimator, WithoutOverlapDataParallelCommunicationIsAllExposed) {
  const ModelDesc m = model_preset("llama3-8b");
  const ClusterSpec c = load_cluster("superpod-384");
  EstimatorOptions serial;
  serial.overlap_communication = false;
  for (const char* text : {"dp=48,tp=8", "dp=48,tp=8,fsdp=1"}) {
    const Strategy s = resolve_strategy(parse_strategy(text), m, 384);
    Estimate hidden = Estimator(m, c).estimate(s), exposed = Estimator(m, c, serial).estimate(s);
    double data_seconds = 0;
    for (const auto& item : exposed.comm)
      if (item.group == "dp*ep*cp") data_seconds += item.seconds;
    EXPECT_GT(data_seconds, 0) << text;
    EXPECT_NEAR(exposed.time.dp + exposed.time.zero, data_seconds, 1e-9 * data_seconds) << text;
    EXPECT_LT(hidden.time.dp + hidden.time.zero, exposed.time.dp + exposed.time.zero) << text;
    EXPECT_DOUBLE_EQ(hidden.time.compute, exposed.time.compute) << text;
  }
}

// cp's items are the calls of its attention mode (plan/cp_traffic.h) on the mode's groups,
// and together they move that table's bytes per rank per layer and microbatch.
TEST(Estimator, CpChargesItsModesCalls) {
  const ModelDesc m = model_preset("llama3-8b");
  struct Case {
    std::string mode;
    hp::Collective kind;  // a call the mode must have
    std::string group;
    int64_t group_size;
  };
  for (const Case& c : {Case{"ring", hp::Collective::SendRecv, "cp_ring", 4},
                        Case{"ulysses", hp::Collective::AllToAll, "cp_ring", 4},
                        Case{"allgather_kv", hp::Collective::AllGather, "cp_ring", 4},
                        Case{"hybrid", hp::Collective::AllToAll, "cp_ulysses", 2}}) {
    const std::string text = "dp=2,cp=4,mb=2,cp_mode=" + c.mode + (c.mode == "hybrid" ? ",cp_ulysses=2" : "");
    Estimate e = run("llama3-8b", "server-8", text);
    bool found = false;
    double per_rank = 0;
    for (const auto& it : e.comm) {
      if (it.name.rfind("cp ", 0) != 0) continue;
      found |= it.kind == c.kind && it.group == c.group && it.group_size == c.group_size;
      per_rank += it.calls * (it.kind == hp::Collective::AllGather ? it.bytes / double(it.group_size) : it.bytes);
    }
    EXPECT_TRUE(found) << text;
    CpAttentionShape shape;
    shape.tokens = double(m.seq_len), shape.heads = m.heads, shape.kv_heads = m.kv_heads;
    shape.head_dim = m.head_size(), shape.element_bytes = 2, shape.cp = 4;
    shape.ulysses = c.mode == "hybrid" ? 2 : 1;
    const double want = cp_bytes_per_rank(cp_attention_calls(c.mode, shape)) * double(m.layers) * 2;
    EXPECT_NEAR(per_rank, want, 1e-9 * want) << text;
    EXPECT_GT(e.time.cp, 0) << text;
  }
  // Ulysses' all-to-alls stand in attention's way; the ring's hops hide behind it.
  EXPECT_GT(run("llama3-8b", "server-8", "dp=2,cp=4,mb=2,cp_mode=ulysses").time.cp,
            run("llama3-8b", "server-8", "dp=2,cp=4,mb=2,cp_mode=ring").time.cp);
}
