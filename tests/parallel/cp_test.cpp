// Context parallelism against single-process attention on the same numbers.
// Hybrid runs Ulysses over an inner mesh dim and the ring over the outer one.
//
// Attention alone: the output and the gradients of q, k and v (the loss is a fixed random
// weighting of the output) of each mode against at::scaled_dot_product_attention with
// rotary at natural positions, on every rank's piece; float32, relative 1e-5 with an
// absolute floor of 1e-6. Each case runs twice, and the second run repeats the first bitwise.
// A whole Llama (12 heads, 4 K/V heads, so that cp = 2, 3 and 4 all divide the heads) trained
// 5 AdamW steps: the loss every step, every gradient after the first step and every
// parameter at the end against the single-process model; float32, relative 1e-5 with an
// absolute floor of 1e-6 (1e-5 for the final parameters, below; parallel/llama_run.h),
// every rank checked to agree bitwise.
// Sequence lengths are not multiples of 2 * cp: shards are uneven (torch.chunk sizes, the
// last ranks hold fewer tokens), no padding; the loss averages over all real tokens.
// Bytes: what the attention core hands its collectives equals the planner's count exactly.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/comm/collective_log.h"
#include "hp/plan/cp_traffic.h"
#include "parallel/llama_run.h"

using namespace hp;

namespace {

constexpr int64_t kSeq = 11;  // uneven over 2, 3 and 4 ranks, head and tail alike

// ---- attention alone ----

struct AttentionCase {
  CpMode mode;
  int cp;
  int64_t seq;
  bool load_balance = true;
  int64_t q_heads = 4, kv_heads = 2;
  bool causal = true;
  int64_t ulysses = 0;  // hybrid: the inner (Ulysses) dim's size; cp is then the ring's
};

// [B, H, S, D] pieces; a mismatch names the rank and the local positions that differ.
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, int rank) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor off = ((got - want).abs() > 1e-6 + 1e-5 * want.abs()).any(-1).any(1).any(0).nonzero().flatten();
  EXPECT_EQ(off.numel(), 0) << what << " on rank " << rank << ": max abs diff " << (got - want).abs().max().item<double>()
                            << " at " << off.numel() << " of " << got.size(2) << " local positions, from "
                            << (off.numel() ? off[0].item<int64_t>() : -1) << " to "
                            << (off.numel() ? off[-1].item<int64_t>() : -1);
}

void expect_attention_matches(const AttentionCase& c) {
  const int64_t b = 2, d = 8;
  const int64_t world = c.cp * std::max<int64_t>(c.ulysses, 1);
  comm::run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh = c.ulysses ? init_device_mesh("cpu", {c.cp, c.ulysses}, {"cp", "cp_uly"})
                                : init_device_mesh("cpu", {c.cp}, {"cp"});
    const std::vector<Placement> seq(mesh.ndim(), Shard(2));
    std::vector<int64_t> sizes{c.cp};
    if (c.ulysses) sizes.push_back(c.ulysses);
    manual_seed(99);
    const at::Tensor q = hp::randn({b, c.q_heads, c.seq, d}), k = hp::randn({b, c.kv_heads, c.seq, d});
    const at::Tensor v = hp::randn({b, c.kv_heads, c.seq, d}), w = hp::randn({b, c.q_heads, c.seq, d});

    nn::Rotary ref_rotary(10000.0);
    const at::Tensor pos = at::arange(c.seq, at::kLong);
    at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
    at::Tensor ref = at::scaled_dot_product_attention(ref_rotary.apply(rq, pos), ref_rotary.apply(rk, pos), rv, {},
                                                      0.0, c.causal, std::nullopt, /*enable_gqa=*/true);
    (ref * w).sum().backward();

    const at::Tensor order =
        at::tensor(sequence_order(nested_sequence_lengths(c.seq, sizes), c.load_balance), at::kLong);
    auto mine = [&](const at::Tensor& full) { return distribute_tensor(full.index_select(2, order), mesh, seq); };
    auto leaf = [&](const at::Tensor& full) {
      DTensor piece = mine(full);
      return DTensor(piece.to_local().detach().requires_grad_(), mesh, piece.spec());
    };
    ContextParallelOptions o;
    o.mode = c.mode, o.load_balance = c.load_balance;
    if (c.ulysses) o.ulysses_dim = "cp_uly";
    // Twice: the second run must repeat the first bitwise (the reduction order is fixed).
    std::vector<at::Tensor> first;
    for (int run = 0; run < 2; ++run) {
      DTensor dq = leaf(q), dk = leaf(k), dv = leaf(v);
      nn::Rotary rotary(10000.0);
      DTensor out = context_parallel_attention(nn::AttentionCoreInputs{dq, dk, dv, rotary, c.causal}, 0, o);
      (out.to_local() * mine(w).to_local()).sum().backward();
      const std::vector<at::Tensor> got{out.to_local(), dq.to_local().grad(), dk.to_local().grad(),
                                        dv.to_local().grad()};
      const std::vector<at::Tensor> want{ref, rq.grad(), rk.grad(), rv.grad()};
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (size_t i = 0; i < got.size(); ++i) {
        expect_close(got[i], mine(want[i].detach()).to_local(), names[i], rank);
        if (run == 1) EXPECT_TRUE(at::equal(got[i], first[i])) << names[i] << " differs between runs on rank " << rank;
      }
      first = got;
    }
  });
}

// ---- bytes moved against the planner's ----

// What each rank hands the cp groups' collectives (the collective log's bytes, sends but
// not receives) in one forward and backward of the attention core, against
// plan::cp_attention_calls, which the estimator prices: equal on every rank (the sequence,
// 24 tokens, divides evenly here).
void expect_bytes_match_planner(const AttentionCase& c) {
  const int64_t b = 2, d = 8, seq = 24;
  const int64_t world = c.cp * std::max<int64_t>(c.ulysses, 1);
  plan::CpAttentionShape shape;
  shape.tokens = double(b * seq), shape.heads = c.q_heads, shape.kv_heads = c.kv_heads, shape.head_dim = d;
  shape.element_bytes = 4, shape.cp = world, shape.ulysses = std::max<int64_t>(c.ulysses, 1);
  const double want = plan::cp_bytes_per_rank(plan::cp_attention_calls(to_string(c.mode), shape));
  EXPECT_GT(want, 0);
  comm::run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh = c.ulysses ? init_device_mesh("cpu", {c.cp, c.ulysses}, {"cp", "cp_uly"})
                                : init_device_mesh("cpu", {c.cp}, {"cp"});
    const std::vector<Placement> sharded(mesh.ndim(), Shard(2));
    manual_seed(5);
    auto leaf = [&](int64_t heads) {
      DTensor t = distribute_tensor(hp::randn({b, heads, seq, d}), mesh, sharded);
      return DTensor(t.to_local().detach().requires_grad_(), mesh, t.spec());
    };
    DTensor q = leaf(c.q_heads), k = leaf(c.kv_heads), v = leaf(c.kv_heads);
    nn::Rotary rotary(10000.0);
    ContextParallelOptions o;
    o.mode = c.mode;
    if (c.ulysses) o.ulysses_dim = "cp_uly";
    comm::CollectiveLog& log = comm::current_world()->collective_log();
    log.clear();
    log.enable(true);
    context_parallel_attention(nn::AttentionCoreInputs{q, k, v, rotary, true}, 0, o).to_local().sum().backward();
    log.enable(false);
    double got = 0;
    for (const auto& r : log.records())
      if (r.op != "recv") got += double(r.bytes());
    EXPECT_EQ(got, want) << to_string(c.mode) << ", rank " << rank;
  });
}

// ---- a whole Llama ----

void cp_llama(nn::LlamaConfig& c) { c.dim = 48, c.heads = 12, c.kv_heads = 4, c.max_seq = 16; }

const hp::testing::LlamaRun& reference() {
  static const hp::testing::LlamaRun run = [] {
    hp::testing::LlamaRunSpec spec;
    spec.seq = kSeq;
    spec.configure = cp_llama;
    return hp::testing::train_llama(spec);
  }();
  return run;
}

struct LlamaCase {
  CpMode mode;
  int64_t cp, dp = 1, tp = 1;
  bool fsdp = false;
  bool load_balance = true;
  int64_t ulysses = 1;  // hybrid: the inner (Ulysses) dim's size; cp is then the ring's
};

void expect_llama_matches(const LlamaCase& c) {
  hp::testing::LlamaRunSpec spec;
  // Only the dims in use: the redistribution planner searches every dim of the mesh.
  spec.mesh_shape.clear(), spec.mesh_names.clear();
  for (auto [size, name] : {std::make_pair(c.dp, "dp"), std::make_pair(c.cp, "cp"), std::make_pair(c.ulysses, "cp_uly"),
                            std::make_pair(c.tp, "tp")})
    if (size > 1 || std::string(name) == "cp") spec.mesh_shape.push_back(size), spec.mesh_names.push_back(name);
  std::vector<std::string> cp_dims{"cp"};
  if (c.ulysses > 1) cp_dims.push_back("cp_uly");
  spec.seq = kSeq;
  spec.configure = cp_llama;
  ContextParallelOptions o;
  o.mode = c.mode, o.load_balance = c.load_balance;
  if (c.ulysses > 1) o.ulysses_dim = "cp_uly";
  spec.parallelize = [c, o](nn::Llama& model, const DeviceMesh& mesh) {
    if (c.tp > 1) parallelize_llama(model, mesh["tp"]);
    parallelize_module(model, mesh["cp"], {{"layers.*.attn", ContextParallel(o)}});
    if (c.fsdp) fully_shard_llama(model, mesh["dp"]);
    return std::function<void(bool)>();
  };
  spec.shard_batch = [o, cp_dims](const at::Tensor& ids, const at::Tensor& targets, const DeviceMesh& mesh) {
    std::vector<Placement> rows(mesh.ndim(), Replicate());
    if (mesh.dim_names()[0] == "dp") rows[0] = Shard(0);
    return std::make_pair(shard_sequence(ids, mesh, rows, cp_dims, o.load_balance),
                          shard_sequence(targets, mesh, rows, cp_dims, o.load_balance));
  };
  // The final parameters to 1e-5 (lr / 1000): AdamW divides by the root of the second
  // moment, which lifts the rounding of a near-zero gradient (the split attention sums its
  // pieces in another order) to a step of its own; up to 2.7e-6 measured on an AMD EPYC,
  // under 1e-6 on an Intel Xeon. A wrong gradient moves a parameter by about lr a step.
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), reference(), 1e-5, 1e-6, 1e-5);
}

}  // namespace

// One line per configuration.
TEST(ContextParallelAttention, UlyssesCp2) { expect_attention_matches({CpMode::ulysses, 2, 13}); }
TEST(ContextParallelAttention, UlyssesCp4KvHeadsRepeated) { expect_attention_matches({CpMode::ulysses, 4, 13, true, 8, 2}); }
TEST(ContextParallelAttention, UlyssesCp3KvHeadsRepeatedFully) { expect_attention_matches({CpMode::ulysses, 3, 7, true, 6, 2}); }
TEST(ContextParallelAttention, AllgatherKvCp3) { expect_attention_matches({CpMode::allgather_kv, 3, 13}); }
TEST(ContextParallelAttention, RingCp2) { expect_attention_matches({CpMode::ring, 2, 13}); }
TEST(ContextParallelAttention, RingCp3Contiguous) { expect_attention_matches({CpMode::ring, 3, 13, false}); }
TEST(ContextParallelAttention, RingCp4) { expect_attention_matches({CpMode::ring, 4, 13}); }
TEST(ContextParallelAttention, RingCp4NotCausal) { expect_attention_matches({CpMode::ring, 4, 10, true, 4, 2, false}); }
TEST(ContextParallelAttention, RingCp4FewerTokensThanHalves) { expect_attention_matches({CpMode::ring, 4, 5}); }
TEST(ContextParallelAttention, RingCp2RunsLongerThanATile) { expect_attention_matches({CpMode::ring, 2, 1201, true, 2, 1}); }
TEST(ContextParallelAttention, UlyssesCp2Long) { expect_attention_matches({CpMode::ulysses, 2, 1201, true, 2, 1}); }
TEST(ContextParallelAttention, AllgatherKvCp2Long) { expect_attention_matches({CpMode::allgather_kv, 2, 1201, true, 2, 1}); }
TEST(ContextParallelAttention, AllgatherKvCp4FewerTokensThanHalves) { expect_attention_matches({CpMode::allgather_kv, 4, 5}); }

TEST(ContextParallelAttention, HybridRing2Ulysses2) { expect_attention_matches({CpMode::hybrid, 2, 13, true, 4, 2, true, 2}); }
TEST(ContextParallelAttention, HybridRing2Ulysses3KvHeadsRepeated) { expect_attention_matches({CpMode::hybrid, 2, 17, true, 6, 2, true, 3}); }

TEST(ContextParallelLlama, UlyssesCp2) { expect_llama_matches({CpMode::ulysses, 2}); }
TEST(ContextParallelLlama, UlyssesCp3) { expect_llama_matches({CpMode::ulysses, 3}); }
TEST(ContextParallelLlama, UlyssesCp4) { expect_llama_matches({CpMode::ulysses, 4}); }
TEST(ContextParallelLlama, AllgatherKvCp2) { expect_llama_matches({CpMode::allgather_kv, 2}); }
TEST(ContextParallelLlama, AllgatherKvCp3) { expect_llama_matches({CpMode::allgather_kv, 3}); }
TEST(ContextParallelLlama, AllgatherKvCp4) { expect_llama_matches({CpMode::allgather_kv, 4}); }
TEST(ContextParallelLlama, RingCp2) { expect_llama_matches({CpMode::ring, 2}); }
TEST(ContextParallelLlama, RingCp3) { expect_llama_matches({CpMode::ring, 3}); }
TEST(ContextParallelLlama, RingCp4) { expect_llama_matches({CpMode::ring, 4}); }
TEST(ContextParallelLlama, RingCp3Contiguous) { expect_llama_matches({CpMode::ring, 3, 1, 1, false, false}); }
TEST(ContextParallelLlama, UlyssesCp2Tp2) { expect_llama_matches({CpMode::ulysses, 2, 1, 2}); }
TEST(ContextParallelLlama, RingCp2Tp2) { expect_llama_matches({CpMode::ring, 2, 1, 2}); }
TEST(ContextParallelLlama, RingCp2Dp2) { expect_llama_matches({CpMode::ring, 2, 2}); }
TEST(ContextParallelLlama, HybridRing2Ulysses2) { expect_llama_matches({CpMode::hybrid, 2, 1, 1, false, true, 2}); }
TEST(ContextParallelLlama, HybridRing3Ulysses2) { expect_llama_matches({CpMode::hybrid, 3, 1, 1, false, true, 2}); }
TEST(ContextParallelLlama, UlyssesCp2Fsdp2) { expect_llama_matches({CpMode::ulysses, 2, 2, 1, true}); }

TEST(ContextParallelTraffic, UlyssesCp2) { expect_bytes_match_planner({CpMode::ulysses, 2, 0}); }
TEST(ContextParallelTraffic, UlyssesCp4KvHeadsRepeated) { expect_bytes_match_planner({CpMode::ulysses, 4, 0, true, 8, 2}); }
TEST(ContextParallelTraffic, RingCp3) { expect_bytes_match_planner({CpMode::ring, 3, 0}); }
TEST(ContextParallelTraffic, AllgatherKvCp4) { expect_bytes_match_planner({CpMode::allgather_kv, 4, 0}); }
TEST(ContextParallelTraffic, HybridRing2Ulysses2) { expect_bytes_match_planner({CpMode::hybrid, 2, 0, true, 4, 2, true, 2}); }
TEST(ContextParallelTraffic, HybridRing2Ulysses3KvHeadsRepeated) { expect_bytes_match_planner({CpMode::hybrid, 2, 0, true, 6, 2, true, 3}); }

// ---- layout and errors ----

TEST(ContextParallelLayout, HeadTailRunsCoverTheSequenceAndBalanceCausalWork) {
  // 8 tokens over 2 ranks: rank 0 holds 0-1 and 6-7, rank 1 holds 2-5.
  EXPECT_EQ(sequence_positions(8, 2, 0, true), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(sequence_positions(8, 2, 1, true), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(sequence_positions(8, 2, 1, false), (std::vector<int64_t>{4, 5, 6, 7}));
  // Over two mesh dims: torch.chunk of torch.chunk (10 over 2 x 2 is 3, 2, 3, 2, not 3, 3, 3, 1).
  EXPECT_EQ(nested_sequence_lengths(10, {2, 2}), (std::vector<int64_t>{3, 2, 3, 2}));
  for (int64_t seq : {5, 11, 4096})
    for (int cp : {2, 3, 4}) {
      std::vector<int64_t> order = sequence_order(seq, cp, true);
      std::sort(order.begin(), order.end());
      for (int64_t i = 0; i < seq; ++i) ASSERT_EQ(order[i], i) << seq << " tokens over " << cp;
    }
  // Causal work of a rank: the keys its queries see. Balanced within 1%, else up to 2cp-1 x.
  auto work = [](int cp, int rank, bool balance) {
    int64_t keys = 0;
    for (int64_t p : sequence_positions(4096, cp, rank, balance)) keys += p + 1;
    return double(keys);
  };
  for (int cp : {2, 3, 4}) {
    EXPECT_LT(work(cp, 0, true) / work(cp, cp - 1, true), 1.01) << cp;
    EXPECT_GT(work(cp, cp - 1, false) / work(cp, 0, false), 2.0 * cp - 1.1) << cp;
  }
}

TEST(ContextParallelErrors, BadSettingsAreNamed) {
  EXPECT_THROW(cp_mode_from_string("rign"), hp::Error);
  comm::run_local_ranks(3, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {3}, {"cp"});
    nn::LlamaConfig c = hp::testing::tiny_llama();  // 4 heads
    nn::Llama model(c, mesh);
    ContextParallelOptions ulysses;
    ulysses.mode = CpMode::ulysses;
    try {
      parallelize_module(model, mesh["cp"], {{"layers.*.attn", ContextParallel(ulysses)}});
      ADD_FAILURE() << "4 heads over 3 ranks were accepted";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("4 attention heads"), std::string::npos) << e.what();
    }
    EXPECT_THROW(parallelize_module(model, mesh["cp"], {{"layers.*.mlp", ContextParallel()}}), hp::Error);
    // The sequence must be sharded over cp: a replicated one is refused, naming the layout.
    manual_seed(1);
    DTensor q = distribute_tensor(hp::randn({1, 4, 6, 4}), mesh, {Replicate()});
    nn::Rotary rotary(10000.0);
    EXPECT_THROW(context_parallel_attention(nn::AttentionCoreInputs{q, q, q, rotary, true}, 0, {}), hp::Error);
    // Heads held on a rank (after tensor parallelism) that cp does not divide, at run time.
    DTensor sharded = distribute_tensor(hp::randn({1, 4, 6, 4}), mesh, {Shard(2)});
    try {
      context_parallel_attention(nn::AttentionCoreInputs{sharded, sharded, sharded, rotary, true}, 0, ulysses);
      ADD_FAILURE() << "4 query heads over 3 ranks were accepted";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("4 query heads"), std::string::npos) << e.what();
    }
  });
}
