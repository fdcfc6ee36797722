// Expert parallelism with the token exchange in chunks (MoEOptions::num_chunks) against the
// same run unchunked, on the same mesh and numbers: the loss of every step, every gradient
// of the first step, every parameter after 5 AdamW steps, on every rank (each rank's whole
// tensors must also agree bitwise with every other rank's). The model is moe_test's tiny
// MoELlama (4 experts, top-2, experts 8 wide), batch 4 x 8 tokens.
//
// Equality. Chunks are row subsets of the unchunked grouped products (same tokens, same
// routing, capacity applied before chunking), so the first forward, whose weights are
// equal, is bitwise equal (the step-0 loss is compared exactly). The expert weights'
// gradients are sums of C + 1 partial products (the rows that stay on their rank, then
// each chunk's) instead of one, which rounds differently; from there on values agree to
// float32 rounding: relative 1e-6, with an absolute floor
// of 1e-6 (a few float32 steps of the parameters' size; AdamW's division by the root of
// the second moment lifts rounding differences of small gradients to that size).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <mutex>

#include "comm/scoped_env.h"
#include "hp/comm/trace.h"
#include "hp/optim/adamw.h"
#include "hp/parallel.h"
#include "parallel/llama_run.h"
#include "hp/tensor/memory_stats.h"
#include "hp/tensor/weight_outputs.h"

using namespace hp;

namespace {

struct MoERun : hp::testing::LlamaRun {
  std::vector<double> drop_rates;  // per rank, step 0
};

struct Spec {
  int64_t ep = 2;
  int64_t dp = 1;
  int64_t chunks = 1;
  bool fsdp = false;
  bool zero_router = false;  // step 0 routes every token alike (ties go to the lowest experts)
  nn::MoELlamaConfig config = hp::testing::tiny_moe_llama();
};

// A MoE layer of `dim` (experts of width 8) drawn from seed 7, its experts split over the
// mesh's ep dim.
std::unique_ptr<nn::MoE> expert_parallel_moe(const DeviceMesh& mesh, int64_t dim, const nn::MoEOptions& o) {
  manual_seed(7);
  auto moe = std::make_unique<nn::MoE>(dim, 8, o, mesh);
  parallelize_module(*moe, mesh["ep"], {{"", ExpertParallel()}});
  return moe;
}

MoERun train(const Spec& s) {
  const int64_t batch = 4, seq = 8, steps = 5;
  nn::MoELlamaConfig config = s.config;
  config.moe.num_chunks = s.chunks;
  std::mutex mu;
  std::vector<MoERun> views(s.ep * s.dp);
  comm::run_local_ranks(static_cast<int>(s.ep * s.dp), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {s.dp, s.ep}, {"dp", "ep"});
    manual_seed(1234);
    nn::MoELlama model(config, mesh);
    if (s.zero_router)
      for (auto& [name, p] : model.named_parameters())
        if (name.find("router.gate") != std::string::npos) p->to_local().detach().zero_();
    parallelize_module(model, mesh["ep"], {{"layers.1.moe", ExpertParallel()}});
    if (s.fsdp) {
      for (auto& [name, m] : model.named_modules())
        if (name == "layers.1.moe.experts") fully_shard(*m, mesh["dp"]);
      for (auto& [name, m] : model.named_modules())
        if (name == "layers.0" || name == "layers.1") fully_shard(*m, mesh["dp"]);
      fully_shard(model, mesh["dp"]);
    }
    optim::AdamW opt(model.parameters(), hp::testing::adamw_options());
    nn::MoE& moe = *nn::moe_layers(model).at(0);
    EXPECT_EQ(moe.token_dispatcher().pipelines(), s.chunks > 1);
    const at::Tensor tokens = (hp::rand({batch, seq + 1}, at::kDouble) * config.llama.vocab).floor().to(at::kLong);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, seq).contiguous(), mesh, {Shard(0), Shard(0)});
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, seq).contiguous(), mesh, {Shard(0), Shard(0)});
    MoERun mine;
    for (int64_t step = 0; step < steps; ++step) {
      DTensor loss = model.loss(ids, targets);
      loss.to_local().backward();
      mine.losses.push_back(loss.full_tensor().item<double>());
      if (step == 0) {
        mine.drop_rates.push_back(moe.token_dispatcher().drop_rate());
        for (auto& [name, p] : model.named_parameters()) mine.first_grads[name] = p->grad()->full_tensor();
      }
      opt.step();
      opt.zero_grad();
      nn::update_expert_bias(model);
    }
    for (auto& [name, p] : model.named_parameters()) mine.final_params[name] = p->full_tensor();
    std::lock_guard<std::mutex> lock(mu);
    views[rank] = mine;
  });
  hp::testing::expect_ranks_agree(views);  // every rank holds the same whole tensors, bitwise
  MoERun out = views[0];
  out.drop_rates.clear();
  for (auto& v : views) out.drop_rates.push_back(v.drop_rates.at(0));
  return out;
}

// `s` in s.chunks chunks against the same run in one. The first forward is bitwise the
// unchunked one where the BLAS rounds a row of a product alike whatever the row count
// (`bitwise_forward`); a product of one row may take another kernel (MKL on AVX-512 does).
void expect_matches_unchunked(Spec s, bool bitwise_forward = true) {
  ASSERT_GT(s.chunks, 1);
  MoERun run = train(s);
  s.chunks = 1;
  MoERun ref = train(s);
  ASSERT_EQ(run.losses.size(), ref.losses.size());
  if (bitwise_forward)
    EXPECT_EQ(run.losses[0], ref.losses[0]) << "the first forward must be bitwise the unchunked one";
  else
    EXPECT_NEAR(run.losses[0], ref.losses[0], 1e-6 * std::abs(ref.losses[0])) << "the first forward";
  for (size_t i = 1; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], 1e-6 * std::abs(ref.losses[i])) << "loss at step " << i;
  EXPECT_EQ(run.drop_rates, ref.drop_rates);
  auto close = [](const at::Tensor& got, const at::Tensor& want, const std::string& what) {
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-6)) << what << ": max abs diff " << (got - want).abs().max().item<double>();
  };
  for (auto& [name, g] : ref.first_grads) close(run.first_grads.at(name), g, "gradient of " + name);
  for (auto& [name, p] : ref.final_params) close(run.final_params.at(name), p, "parameter " + name);
}

// Bytes both ranks (threads of this process) hold after a forward, above what they held
// before it: what the step keeps for its backward. A step before warms the collectives'
// buffer pools.
int64_t kept_after_forward(int64_t chunks) {
  track_cpu_memory();
  nn::MoELlamaConfig config = hp::testing::tiny_moe_llama();
  config.llama.dim = 32, config.llama.max_seq = 32;
  config.moe.num_chunks = chunks;
  const int64_t batch = 16, seq = 32;
  int64_t kept = 0;
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {1, 2}, {"dp", "ep"});
    manual_seed(1234);
    nn::MoELlama model(config, mesh);
    parallelize_module(model, mesh["ep"], {{"layers.1.moe", ExpertParallel()}});
    const at::Tensor tokens = (hp::rand({batch, seq + 1}, at::kDouble) * config.llama.vocab).floor().to(at::kLong);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, seq).contiguous(), mesh, {Shard(0), Shard(0)});
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, seq).contiguous(), mesh, {Shard(0), Shard(0)});
    model.loss(ids, targets).to_local().backward();
    const comm::Group& all = mesh.whole_group();
    comm::barrier(all);
    const int64_t before = cpu_memory_allocated();
    comm::barrier(all);
    DTensor loss = model.loss(ids, targets);
    comm::barrier(all);
    if (rank == 0) kept = cpu_memory_allocated() - before;
    comm::barrier(all);
    loss.to_local().backward();
  });
  return kept;
}

Spec chunked(int64_t ep, int64_t chunks) {
  Spec s;
  s.ep = ep, s.chunks = chunks;
  return s;
}

}  // namespace

// The chunks' outputs are sent back, not kept: a chunked layer keeps what the unchunked one
// does, and its plan's row indices (8 bytes a row, against 128 for a row of outputs).
TEST(MoEChunks, KeepsWhatTheUnchunkedLayerKeeps) {
  const int64_t unchunked = kept_after_forward(1), chunked = kept_after_forward(2);
  const int64_t outputs = 16 * 32 * 2 * 32 * 4;  // tokens x top_k rows of dim 32, both ranks
  std::printf("kept after the forward: unchunked %lld B, 2 chunks %lld B, the layer's outputs %lld B\n",
              static_cast<long long>(unchunked), static_cast<long long>(chunked), static_cast<long long>(outputs));
  EXPECT_LT(chunked - unchunked, outputs / 4);
}

TEST(MoEChunks, Ep2TwoChunks) { expect_matches_unchunked(chunked(2, 2)); }
TEST(MoEChunks, Ep2ThreeChunks) { expect_matches_unchunked(chunked(2, 3)); }
TEST(MoEChunks, Ep4TwoChunks) { expect_matches_unchunked(chunked(4, 2)); }
TEST(MoEChunks, Ep4ThreeChunks) { expect_matches_unchunked(chunked(4, 3)); }

// 8 tokens per rank in 12 chunks: the last chunks are empty on every rank, and still
// exchanged (zero rows) in step; the others hold one token each, whose products may round
// as a one-row product does.
TEST(MoEChunks, MoreChunksThanTokens) { expect_matches_unchunked(chunked(4, 12), /*bitwise_forward=*/false); }

// 6 experts over 4 ranks (2, 2, 2, 0): one rank computes no expert at all.
TEST(MoEChunks, RankWithoutExperts) {
  Spec s = chunked(4, 3);
  s.config.moe.num_experts = 6;
  expect_matches_unchunked(s);
}

// Step 0 sends every token to one expert (top-1, all scores tied): the other experts,
// and the rank not holding it, get nothing in any chunk.
TEST(MoEChunks, AllTokensToOneExpert) {
  Spec s = chunked(2, 3);
  s.config.moe.top_k = 1;
  s.zero_router = true;
  expect_matches_unchunked(s);
}

// Tied scores and capacity 1.0: half of step 0's assignments drop, before chunking.
TEST(MoEChunks, CapacityFactorDrops) {
  Spec s = chunked(2, 2);
  s.config.moe.capacity_factor = 1.0, s.config.moe.aux_loss_coef = 0;
  s.zero_router = true;
  MoERun run = train(s);
  EXPECT_EQ(run.drop_rates, (std::vector<double>{0.5, 0.5}));
  expect_matches_unchunked(s);
}

// The shared experts run behind the last combine.
TEST(MoEChunks, SharedExperts) {
  Spec s = chunked(2, 3);
  s.config.moe.num_shared_experts = 1, s.config.moe.score_func = "sigmoid";
  expect_matches_unchunked(s);
}

// Experts fully sharded over dp as well: the chunks run inside the experts' unit.
TEST(MoEChunks, Dp2Ep2FullyShard) {
  Spec s = chunked(2, 2);
  s.dp = 2, s.fsdp = true;
  expect_matches_unchunked(s);
}

// The chunks' exchanges on the progress engine, overlapped, against the same exchanges
// run on the calling thread (HP_ASYNC_COLLECTIVES=0): bitwise equal.
TEST(MoEChunks, BitwiseEqualWithCollectivesOnTheCallingThread) {
  Spec s = chunked(4, 3);
  s.config.moe.num_shared_experts = 1;
  MoERun overlapped = train(s);
  MoERun on_caller;
  {
    ScopedEnv off("HP_ASYNC_COLLECTIVES", "0");
    on_caller = train(s);
  }
  EXPECT_EQ(overlapped.losses, on_caller.losses);
  for (auto which : {&MoERun::first_grads, &MoERun::final_params})
    for (auto& [name, t] : on_caller.*which)
      EXPECT_TRUE(at::equal((overlapped.*which).at(name), t)) << name << " differs";
}

// Chunked, every assignment is dispatched once (T * top_k rows over all ranks); those
// bound for another rank's experts cross in the token all-to-alls both ways, those for
// the rank's own stay out of them, plus one all-to-all of the counts of every chunk.
TEST(MoEChunks, DispatchMovesTheAnalyticBytes) {
  const int64_t t = 24, dim = 16, k = 2, experts = 6, chunks = 3;
  std::vector<int64_t> float_numel(4), local_rows(4), sent_rows(4);
  comm::run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {4}, {"ep"});
    nn::MoEOptions o;
    o.num_experts = experts, o.top_k = k, o.num_chunks = chunks;
    auto moe = expert_parallel_moe(mesh, dim, o);
    DTensor x = hp::randn({t, dim}, mesh, {Shard(0)});
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    DTensor y = (*moe)(x);
    log.enable(false);
    const auto& dispatcher = dynamic_cast<const AllToAllTokenDispatcher&>(moe->token_dispatcher());
    local_rows[rank] = dispatcher.rows_local();
    sent_rows[rank] = dispatcher.rows_sent();
    int counts_exchanges = 0, token_exchanges = 0;
    for (const auto& r : log.records()) {
      EXPECT_NE(r.op, "all_gather") << r.to_string();
      if (r.op != "all_to_all") continue;
      if (r.dtype == at::kLong) {
        ++counts_exchanges;
        EXPECT_EQ(r.numel, chunks * experts);
      } else {
        ++token_exchanges;
        float_numel[rank] += r.numel;
      }
    }
    EXPECT_EQ(counts_exchanges, 1);
    EXPECT_EQ(token_exchanges, 2 * chunks);
  });
  const auto sum = [](const std::vector<int64_t>& v) { return v[0] + v[1] + v[2] + v[3]; };
  EXPECT_EQ(sum(sent_rows), t * k);
  EXPECT_GT(sum(local_rows), 0);
  EXPECT_EQ(sum(float_numel), 2 * (t * k - sum(local_rows)) * dim);
}

// The overlap's order, read from the collective log (which records each exchange when it
// is posted). Top-1 of tied scores sends every token to expert 3, on rank 1: rank 0 sends
// rows in every dispatch chunk and none in the combines. Forward: all C dispatches are
// posted before any chunk's combine (posted one by one, dispatch and combine would
// alternate); backward: all combine gradients before any dispatch gradient.
TEST(MoEChunks, ExchangesArePostedAheadOfTheExperts) {
  const int64_t t = 12, dim = 16, chunks = 3;
  std::vector<std::vector<int64_t>> forward(2), backward(2);  // rows per float all-to-all, in order
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"ep"});
    nn::MoEOptions o;
    o.num_experts = 4, o.top_k = 1, o.num_chunks = chunks;
    auto moe = expert_parallel_moe(mesh, dim, o);
    for (auto& [name, p] : moe->named_parameters())
      if (name == "router.gate.weight") p->to_local().detach().zero_();
    DTensor x = hp::randn({t, dim}, mesh, {Shard(0)});
    x.to_local().requires_grad_(true);
    auto& log = comm::current_world()->collective_log();
    auto rows = [&] {
      std::vector<int64_t> out;
      for (const auto& r : log.records())
        if (r.op == "all_to_all" && r.dtype == at::kFloat) out.push_back(r.numel / dim);
      log.clear();
      return out;
    };
    log.clear();
    log.enable();
    DTensor y = (*moe)(x);
    forward[rank] = rows();
    y.to_local().sum().backward();
    backward[rank] = rows();
    log.enable(false);
  });
  const int64_t per_chunk = t / 2 / chunks;  // rank 0's 6 tokens in 3 chunks
  EXPECT_EQ(forward[0], (std::vector<int64_t>{per_chunk, per_chunk, per_chunk, 0, 0, 0}));
  // Rank 1's own tokens stay (expert 3 is its own): it sends none, and returns rank 0's.
  EXPECT_EQ(forward[1], (std::vector<int64_t>{0, 0, 0, per_chunk, per_chunk, per_chunk}));
  EXPECT_EQ(backward[0], (std::vector<int64_t>{per_chunk, per_chunk, per_chunk, 0, 0, 0}));
}

// A rank's own rows run in two halves, the first before any remote chunk (while it
// travels) and the second after the last (while its results travel back), forward and
// backward: the experts' compute spans of the trace, in order, on every rank.
TEST(MoEChunks, OwnRowsRunFirstAndLast) {
  const int64_t t = 32, dim = 16, chunks = 2;
  trace::set_enabled(true);
  trace::clear();
  std::vector<int64_t> local_rows(2);
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"ep"});
    nn::MoEOptions o;
    o.num_experts = 4, o.top_k = 2, o.num_chunks = chunks;
    auto moe = expert_parallel_moe(mesh, dim, o);
    DTensor x = hp::randn({t, dim}, mesh, {Shard(0)});
    x.to_local().requires_grad_(true);
    (*moe)(x).to_local().sum().backward();
    local_rows[rank] = dynamic_cast<const AllToAllTokenDispatcher&>(moe->token_dispatcher()).rows_local();
  });
  const std::vector<trace::Event> events = trace::events();
  trace::set_enabled(false);
  trace::clear();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_GE(local_rows[rank], 2) << "rank " << rank;
    const int64_t head = local_rows[rank] / 2;
    for (const std::string what : {"experts chunk ", "experts backward chunk "}) {
      std::vector<std::string> names;
      for (const trace::Event& e : events)
        if (e.rank == rank && e.category == "compute" && e.name.rfind(what, 0) == 0) names.push_back(e.name);
      ASSERT_EQ(names.size(), chunks + 2) << what << "on rank " << rank;
      EXPECT_EQ(names.front(), what + "0: " + std::to_string(head) + " local rows");
      EXPECT_EQ(names.back(), what + std::to_string(chunks + 1) + ": " + std::to_string(local_rows[rank] - head) +
                                  " local rows");
      for (int64_t c = 1; c <= chunks; ++c) {
        const std::string& name = names[c];
        EXPECT_EQ(name.rfind(what + std::to_string(c) + ": ", 0), 0u) << name;
        EXPECT_EQ(name.find("local"), std::string::npos) << name;
      }
    }
  }
}

// Zero-bubble schedules split the backward into I and W; the chunks' one backward node
// computes both, so a chunked forward under a split backward's recorder is refused.
TEST(MoEChunks, SplitBackwardIsRefused) {
  comm::run_local_ranks(2, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"ep"});
    nn::MoEOptions o;
    o.num_experts = 4, o.num_chunks = 2;
    nn::MoE moe(16, 8, o, mesh);
    parallelize_module(moe, mesh["ep"], {{"", ExpertParallel()}});
    DTensor x = hp::randn({8, 16}, mesh, {Shard(0)});
    WeightOutputRecorder recorder;
    try {
      moe(x);
      ADD_FAILURE() << "chunked experts ran under a split backward's recorder";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("split backward"), std::string::npos) << e.what();
    }
  });
}

TEST(MoEChunks, BadChunkCountsAreRefused) {
  for (int64_t chunks : {0, -2}) {
    nn::MoEOptions o;
    o.num_chunks = chunks;
    try {
      o.validate();
      ADD_FAILURE() << "num_chunks " << chunks << " accepted";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("num_chunks"), std::string::npos) << e.what();
    }
  }
}
