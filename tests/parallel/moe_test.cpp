// Expert parallelism against the single-process model on the same numbers. The model is
// a tiny MoELlama (1 dense block, 1 MoE block; 4 experts, top-2 of softmax scores, aux
// loss on, experts 8 wide), the batch 4 x 8 tokens, 5 AdamW steps on one batch. Compared:
// the loss of every step, every gradient of the first step, every parameter (and the
// expert bias) after the last step, on every rank. float32; tolerance: relative 1e-5 with
// an absolute floor of 1e-6 for values near zero. Capacity-factor runs compare with the
// reference taking each rank's rows as one micro-batch (capacity is per rank's batch).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "hp/optim/adamw.h"
#include "hp/parallel.h"
#include "parallel/llama_run.h"

using namespace hp;

namespace {

using hp::testing::tiny_moe_llama;

struct MoERun : hp::testing::LlamaRun {
  std::vector<double> first_drop_rates;  // per rank, step 0
  std::vector<int64_t> first_rows_received;
};

struct Spec {
  std::vector<int64_t> shape{1};
  std::vector<std::string> names{"dp"};  // batch rows are split over ep and dp* dims
  nn::MoELlamaConfig config = tiny_moe_llama();
  int64_t ep = 1, tp = 1;
  bool fsdp = false;
  bool fsdp_over_dp_ep = false;  // the non-expert units over dp x ep flattened, the experts' over dp
  bool ddp = false;  // DistributedDataParallel over the batch dims (dp*, ep)
  bool sequence_parallel = false;  // tp by parallelize_moe_llama's plan with sequence parallelism
  bool zero_router = false;  // step 0 routes every token alike (ties go to the lowest experts)
  int micro_steps = 1;       // the reference's view of per-rank capacity
  int64_t batch = 4, seq = 8, steps = 5;
};

bool is_batch_dim(const std::string& name) { return name == "ep" || name.rfind("dp", 0) == 0; }

std::vector<std::string> batch_dims(const Spec& s) {
  std::vector<std::string> out;
  for (const std::string& name : s.names)
    if (is_batch_dim(name)) out.push_back(name);
  return out;
}

void parallelize(nn::MoELlama& model, const DeviceMesh& mesh, const Spec& s) {
  if (s.ep > 1) parallelize_module(model, mesh["ep"], {{"layers.1.moe", ExpertParallel()}});
  if (s.sequence_parallel)
    parallelize_moe_llama(model, mesh["tp"], {/*loss_parallel=*/true, /*sequence_parallel=*/true});
  else if (s.tp > 1)
    parallelize_module(model, mesh["tp"],
                       {{"layers.*.attn.q_proj", ColwiseParallel()},
                        {"layers.*.attn.k_proj", ColwiseParallel()},
                        {"layers.*.attn.v_proj", ColwiseParallel()},
                        {"layers.*.attn.o_proj", RowwiseParallel()},
                        {"layers.0.mlp.gate_proj", ColwiseParallel()},
                        {"layers.0.mlp.up_proj", ColwiseParallel()},
                        {"layers.0.mlp.down_proj", RowwiseParallel()},
                        {"layers.1.moe", ExpertTensorParallel()}});
  if (s.fsdp) {
    const DeviceMesh outer = s.fsdp_over_dp_ep ? mesh[{"dp", "ep"}].flatten("dp_ep") : mesh["dp"];
    for (auto& [name, m] : model.named_modules())
      if (name == "layers.1.moe.experts") fully_shard(*m, mesh["dp"]);  // inner units first
    for (auto& [name, m] : model.named_modules())
      if (name == "layers.0" || name == "layers.1") fully_shard(*m, outer);
    fully_shard(model, outer);
  }
}

MoERun train(const Spec& s) {
  std::mutex mu;
  int64_t world = 1;
  for (int64_t n : s.shape) world *= n;
  std::vector<MoERun> views(world);
  comm::run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", s.shape, s.names);
    manual_seed(1234);
    nn::MoELlama model(s.config, mesh);
    if (s.zero_router)
      for (auto& [name, p] : model.named_parameters())
        if (name.find("router.gate") != std::string::npos) p->to_local().detach().zero_();
    parallelize(model, mesh, s);
    std::optional<DistributedDataParallel> ddp;
    if (s.ddp) ddp.emplace(model, mesh.submesh(batch_dims(s)));
    optim::AdamW opt(model.parameters(), hp::testing::adamw_options());
    std::vector<Placement> rows(mesh.ndim(), Replicate());
    for (int k = 0; k < mesh.ndim(); ++k)
      if (is_batch_dim(s.names[k])) rows[k] = Shard(0);
    nn::MoE& moe = *nn::moe_layers(model).at(0);
    MoERun mine;
    const at::Tensor tokens = (hp::rand({s.batch, s.seq + 1}, at::kDouble) * s.config.llama.vocab).floor().to(at::kLong);
    for (int64_t step = 0; step < s.steps; ++step) {
      double loss_sum = 0;
      const int64_t micro_rows = s.batch / s.micro_steps;
      for (int micro = 0; micro < s.micro_steps; ++micro) {
        at::Tensor part = tokens.narrow(0, micro * micro_rows, micro_rows);
        DTensor ids = distribute_tensor(part.narrow(1, 0, s.seq).contiguous(), mesh, rows);
        DTensor targets = distribute_tensor(part.narrow(1, 1, s.seq).contiguous(), mesh, rows);
        DTensor loss = model.loss(ids, targets);
        (loss.to_local() / double(s.micro_steps)).backward();
        loss_sum += loss.full_tensor().item<double>() / double(s.micro_steps);
        if (step == 0) mine.first_drop_rates.push_back(moe.token_dispatcher().drop_rate());
      }
      if (step == 0)
        if (auto* a2a = dynamic_cast<AllToAllTokenDispatcher*>(&moe.token_dispatcher()))
          mine.first_rows_received.push_back(a2a->rows_received());
      mine.losses.push_back(loss_sum);
      if (step == 0)
        for (auto& [name, p] : model.named_parameters()) mine.first_grads[name] = p->grad()->full_tensor();
      opt.step();
      opt.zero_grad();
      nn::update_expert_bias(model);
    }
    for (auto& [name, p] : model.named_parameters()) mine.final_params[name] = p->full_tensor();
    mine.final_params["layers.1.moe.router.expert_bias"] = moe.router().expert_bias().clone();
    std::lock_guard<std::mutex> lock(mu);
    views[rank] = mine;
  });
  hp::testing::expect_ranks_agree(views);  // every rank holds the same whole tensors, bitwise
  MoERun out = views[0];
  out.first_drop_rates.clear();
  out.first_rows_received.clear();
  for (auto& v : views) {
    out.first_drop_rates.insert(out.first_drop_rates.end(), v.first_drop_rates.begin(), v.first_drop_rates.end());
    out.first_rows_received.insert(out.first_rows_received.end(), v.first_rows_received.begin(),
                                   v.first_rows_received.end());
  }
  return out;
}

void expect_match(const MoERun& run, const MoERun& ref) {
  ASSERT_EQ(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "loss at step " << i;
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  auto close = [](const at::Tensor& got, const at::Tensor& want, double atol, const std::string& what) {
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    EXPECT_TRUE(at::allclose(got, want, 1e-5, atol)) << what << ": max abs diff " << (got - want).abs().max().item<double>();
  };
  for (auto& [name, g] : ref.first_grads) close(run.first_grads.at(name), g, 1e-6, "gradient of " + name);
  // After the AdamW steps (lr 1e-2) a last-bit difference of a near-zero gradient (sums in
  // another order) can move an element by a few 1e-6 (4.9e-6 seen); a wrong gradient moves
  // it by the order of lr.
  for (auto& [name, p] : ref.final_params) close(run.final_params.at(name), p, 1e-5, "parameter " + name);
}

Spec on(std::vector<int64_t> shape, std::vector<std::string> names, int64_t ep, int64_t tp = 1) {
  Spec s;
  s.shape = std::move(shape), s.names = std::move(names), s.ep = ep, s.tp = tp;
  return s;
}

Spec single(const Spec& like) {
  Spec s = like;
  s.shape = {1}, s.names = {"dp"}, s.ep = 1, s.tp = 1, s.fsdp = false, s.ddp = false, s.sequence_parallel = false;
  return s;
}

void expect_matches_single(const Spec& s) { expect_match(train(s), train(single(s))); }

}  // namespace

TEST(ExpertParallel, Ep2) { expect_matches_single(on({2}, {"ep"}, 2)); }
TEST(ExpertParallel, Ep4) { expect_matches_single(on({4}, {"ep"}, 4)); }
TEST(ExpertParallel, Ep2Tp2) { expect_matches_single(on({2, 2}, {"ep", "tp"}, 2, 2)); }
TEST(ExpertParallel, Dp2Ep2) { expect_matches_single(on({2, 2}, {"dp", "ep"}, 2)); }
TEST(ExpertParallel, Dp2Ep2FullyShard) {
  Spec s = on({2, 2}, {"dp", "ep"}, 2);
  s.fsdp = true;
  expect_matches_single(s);
}
// torchtitan's dp_shard_in_ep: the non-expert parameters sharded over every data-parallel
// rank (dp x ep flattened), the experts over ep and then dp.
Spec over_dp_ep(std::vector<int64_t> shape, std::vector<std::string> names, int64_t ep) {
  Spec s = on(std::move(shape), std::move(names), ep);
  s.fsdp = s.fsdp_over_dp_ep = true;
  return s;
}
TEST(ExpertParallel, Dp2Ep2FullyShardOverDpEp) { expect_matches_single(over_dp_ep({2, 2}, {"dp", "ep"}, 2)); }
TEST(ExpertParallel, Dp1Ep4FullyShardOverDpEp) { expect_matches_single(over_dp_ep({1, 4}, {"dp", "ep"}, 4)); }
TEST(ExpertParallel, EpOuterToDpFullyShardOverDpEp) { expect_matches_single(over_dp_ep({2, 2}, {"ep", "dp"}, 2)); }
// 3 experts over ep 2 (2 and 1), the dense MLP's 26 rows over 4 ranks (7, 6, 7, 6), a tp
// dim of size 1 inside.
TEST(ExpertParallel, Dp2Ep2Tp1UnevenFullyShardOverDpEp) {
  Spec s = over_dp_ep({2, 2, 1}, {"dp", "ep", "tp"}, 2);
  s.config.moe.num_experts = 3, s.config.llama.ffn_dim = 26;
  expect_matches_single(s);
}
// One backward at dp 2 x ep 2 (ranks dp * 2 + ep) of the layout `s` describes: every rank's
// collective log; `inspect` reads each rank's parallelized model first.
std::vector<std::vector<comm::CollectiveRecord>> backward_logs(
    const Spec& s, const std::function<void(int, nn::MoELlama&)>& inspect = {}) {
  std::vector<std::vector<comm::CollectiveRecord>> logs(4);
  comm::run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "ep"});
    manual_seed(1234);
    nn::MoELlama model(s.config, mesh);
    parallelize(model, mesh, s);
    std::optional<DistributedDataParallel> ddp;
    if (s.ddp) ddp.emplace(model, mesh.submesh(batch_dims(s)));
    if (inspect) inspect(rank, model);
    const at::Tensor tokens = (hp::rand({4, 9}, at::kDouble) * s.config.llama.vocab).floor().to(at::kLong);
    const std::vector<Placement> rows{Shard(0), Shard(0)};
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, rows);
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, rows);
    DTensor loss = model.loss(ids, targets);
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    loss.to_local().backward();
    log.enable(false);
    logs[rank] = log.records();
  });
  return logs;
}

// One backward's collectives at dp 2 x ep 2 (ranks dp * 2 + ep), units as above: the three
// non-expert units each reduce their gradients in one reduce-scatter over all 4 ranks, the
// experts' unit over its 2 dp ranks, and nothing is all-reduced over an ep group (with the
// units over dp only, every use of a non-expert weight all-reduces its gradient there).
// Each rank holds a quarter of the non-expert parameters (a half with units over dp only).
TEST(ExpertParallel, FullyShardOverDpEpReducesOnceOverAllRanks) {
  const std::vector<int> all{0, 1, 2, 3};
  for (bool over_dp_ep : {false, true}) {
    std::vector<int64_t> non_expert_numel(4), non_expert_total(4);
    Spec s = on({2, 2}, {"dp", "ep"}, 2);
    s.fsdp = true, s.fsdp_over_dp_ep = over_dp_ep;
    const auto logs = backward_logs(s, [&](int rank, nn::MoELlama& model) {
      for (auto& [name, p] : model.named_parameters())
        if (name.find("moe.experts") == std::string::npos)
          non_expert_numel[rank] += p->to_local().numel(), non_expert_total[rank] += c10::multiply_integers(p->sizes());
    });
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(non_expert_numel[rank] * (over_dp_ep ? 4 : 2), non_expert_total[rank]) << "rank " << rank;
      const std::vector<int> ep_group{rank / 2 * 2, rank / 2 * 2 + 1}, dp_group{rank % 2, rank % 2 + 2};
      int over_all = 0, over_dp = 0, ep_all_reduces = 0;
      for (const auto& r : logs[rank]) {
        if (r.op == "reduce_scatter") {
          EXPECT_TRUE(r.ranks == all || r.ranks == dp_group) << r.to_string();
          ++(r.ranks == all ? over_all : over_dp);
        }
        if (r.op == "all_reduce" && r.ranks == ep_group) ++ep_all_reduces;
      }
      if (!over_dp_ep) {
        EXPECT_GT(ep_all_reduces, 0) << "rank " << rank;  // the check can see them
        continue;
      }
      EXPECT_EQ(over_all, 3) << "rank " << rank;
      EXPECT_EQ(over_dp, 1) << "rank " << rank;
      EXPECT_EQ(ep_all_reduces, 0) << "rank " << rank;
    }
  }
}

// DDP over the batch dims (dp, ep): the experts, sharded over ep, are summed over dp only.
Spec ddp(std::vector<int64_t> shape, std::vector<std::string> names, int64_t ep, int64_t tp = 1) {
  Spec s = on(std::move(shape), std::move(names), ep, tp);
  s.ddp = true;
  return s;
}
TEST(ExpertParallel, Dp2Ep2Ddp) { expect_matches_single(ddp({2, 2}, {"dp", "ep"}, 2)); }
TEST(ExpertParallel, Ep4Ddp) { expect_matches_single(ddp({4}, {"ep"}, 4)); }
TEST(ExpertParallel, EpOuterToDpDdp) { expect_matches_single(ddp({2, 2}, {"ep", "dp"}, 2)); }
TEST(ExpertParallel, Ep2Tp2Ddp) { expect_matches_single(ddp({2, 2}, {"ep", "tp"}, 2, 2)); }
// One backward at dp 2 x ep 2 under DDP over (dp, ep): the non-expert gradients are summed
// in buckets over all 4 ranks, the experts' over their 2 dp ranks, and no gradient is
// all-reduced over an ep group at its use (without DDP every non-expert weight is).
TEST(ExpertParallel, DdpOverDpEpReducesInBucketsOverAllRanks) {
  const std::vector<int> all{0, 1, 2, 3};
  for (bool with_ddp : {false, true}) {
    Spec s = on({2, 2}, {"dp", "ep"}, 2);
    s.ddp = with_ddp;
    const auto logs = backward_logs(s);
    for (int rank = 0; rank < 4; ++rank) {
      const std::vector<int> ep_group{rank / 2 * 2, rank / 2 * 2 + 1}, dp_group{rank % 2, rank % 2 + 2};
      int over_all = 0, over_dp = 0, over_ep = 0;
      for (const auto& r : logs[rank])
        if (r.op == "all_reduce") over_all += r.ranks == all, over_dp += r.ranks == dp_group, over_ep += r.ranks == ep_group;
      if (!with_ddp) {
        EXPECT_GT(over_ep, 0) << "rank " << rank;  // the check can see them
        continue;
      }
      EXPECT_GT(over_all, 0) << "rank " << rank;
      EXPECT_GT(over_dp, 0) << "rank " << rank;
      EXPECT_EQ(over_ep, 0) << "rank " << rank;
    }
  }
}

// Sequence parallelism: each tp rank routes its own sequence shard (MoESequenceParallel),
// the routed experts whole over tp; shared experts on, as a dense MLP under SP.
Spec sequence_parallel(std::vector<int64_t> shape, std::vector<std::string> names, int64_t ep) {
  Spec s = on(std::move(shape), std::move(names), ep, 2);
  s.sequence_parallel = true, s.config.moe.num_shared_experts = 1;
  return s;
}
TEST(ExpertParallel, Tp2SequenceParallel) { expect_matches_single(sequence_parallel({2}, {"tp"}, 1)); }
TEST(ExpertParallel, Ep2Tp2SequenceParallel) { expect_matches_single(sequence_parallel({2, 2}, {"ep", "tp"}, 2)); }
TEST(ExpertParallel, Ep2Tp2SequenceParallelFullyShardOverDpEp) {
  Spec s = sequence_parallel({1, 2, 2}, {"dp", "ep", "tp"}, 2);
  s.fsdp = s.fsdp_over_dp_ep = true;
  expect_matches_single(s);
}

// A flattened dim is named by the dims it merges ('_'-joined, flatten()'s default name).
TEST(ExpertParallel, FullyShardOverAFlattenedDimOfAnotherNameIsRefused) {
  comm::run_local_ranks(4, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "ep"});
    nn::MoELlama model(tiny_moe_llama(), mesh);
    try {
      fully_shard(model, mesh[{"dp", "ep"}].flatten("data"));
      ADD_FAILURE() << "a flattened dim named 'data' must be refused";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("joined with '_'"), std::string::npos) << e.what();
    }
  });
}

TEST(ExpertParallel, SixExpertsOverFourRanks) {
  Spec s = on({4}, {"ep"}, 4);
  s.config.moe.num_experts = 6;
  expect_matches_single(s);
}
TEST(ExpertParallel, SigmoidGroupLimitedSharedExperts) {
  Spec s = on({2}, {"ep"}, 2);
  s.config.moe.score_func = "sigmoid", s.config.moe.route_norm = true, s.config.moe.route_scale = 2.5;
  s.config.moe.num_expert_groups = 2, s.config.moe.num_limited_groups = 1, s.config.moe.num_shared_experts = 1;
  expect_matches_single(s);
}

// Step 0 sends every token to one expert (top-1, all scores tied; ATen's CPU topk picks
// the last of tied experts, 3): the other experts, and the rank not holding 3, get nothing.
TEST(ExpertParallel, AllTokensPickOneExpert) {
  Spec s = on({2}, {"ep"}, 2);
  s.config.moe.top_k = 1;
  s.zero_router = true;
  MoERun run = train(s);
  EXPECT_EQ(run.first_rows_received, (std::vector<int64_t>{0, 32}));
  expect_match(run, train(single(s)));
}

// The auxiliary-loss-free bias is updated after every step from the loads summed over
// all ranks: it must be the same on every rank and equal the single process's.
TEST(ExpertParallel, ExpertBiasUpdateAgreesAcrossRanks) {
  Spec s = on({4}, {"ep"}, 4);
  s.config.moe.load_balance_bias = true, s.config.moe.bias_update_rate = 0.05, s.config.moe.aux_loss_coef = 0;
  MoERun run = train(s);
  EXPECT_GT(run.final_params.at("layers.1.moe.router.expert_bias").abs().sum().item<double>(), 0);
  expect_match(run, train(single(s)));
}

// Top-2 of tied scores: two experts get all 16 tokens of each rank's batch, capacity
// ceil(1.0 * 16 * 2 / 4) = 8 each, so half the assignments drop.
TEST(ExpertParallel, CapacityFactorDropsOverflow) {
  Spec s = on({2}, {"ep"}, 2);
  s.config.moe.capacity_factor = 1.0, s.config.moe.aux_loss_coef = 0;
  s.zero_router = true;
  MoERun run = train(s);
  EXPECT_EQ(run.first_drop_rates, (std::vector<double>{0.5, 0.5}));
  Spec ref = single(s);
  ref.micro_steps = 2;
  expect_match(run, train(ref));
}

namespace {

// The collectives each rank logs in one forward of a MoE layer (experts 8 wide) over
// ep = 4, on random tokens [t, dim] split over the ranks.
std::vector<std::vector<comm::CollectiveRecord>> collectives_of_forward(const nn::MoEOptions& o, int64_t t,
                                                                        int64_t dim) {
  std::vector<std::vector<comm::CollectiveRecord>> logs(4);
  comm::run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {4}, {"ep"});
    manual_seed(7);
    nn::MoE moe(dim, 8, o, mesh);
    parallelize_module(moe, mesh["ep"], {{"", ExpertParallel()}});
    DTensor x = hp::randn({t, dim}, mesh, {Shard(0)});
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    moe(x);
    log.enable(false);
    logs[rank] = log.records();
  });
  return logs;
}

}  // namespace

// Dispatch and combine move exactly 2 * T * top_k * dim floats over all ranks (each
// rank's input to the two token all-to-alls), plus one all-to-all of expert counts; no
// token is all-gathered.
TEST(ExpertParallel, DispatchMovesTheAnalyticBytes) {
  const int64_t t = 24, dim = 16, k = 2, experts = 6;
  nn::MoEOptions o;
  o.num_experts = experts, o.top_k = k;
  int64_t float_numel = 0;
  for (const auto& log : collectives_of_forward(o, t, dim)) {
    int counts_exchanges = 0;
    for (const auto& r : log) {
      EXPECT_NE(r.op, "all_gather") << r.to_string();
      if (r.op != "all_to_all") continue;
      if (r.dtype == at::kLong) {
        ++counts_exchanges;
        EXPECT_EQ(r.numel, experts);
      } else {
        float_numel += r.numel;
      }
    }
    EXPECT_EQ(counts_exchanges, 1);
  }
  EXPECT_EQ(float_numel, 2 * t * k * dim);
}

namespace {

// What two MoE layers (4 experts, ep = ranks) log besides their token exchanges: in their
// forward, then in moe_aux_loss, then in update_expert_bias; and the loss, with the sum of
// the layers' losses each reduced alone in a forward before. Per rank.
struct LoggedStep {
  std::vector<std::string> forward, aux_loss, expert_loads;
  double loss = 0, layer_by_layer = 0;
};

std::vector<LoggedStep> collectives_beside_the_exchange(int64_t experts, int ranks) {
  std::vector<LoggedStep> logs(ranks);
  comm::run_local_ranks(ranks, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {ranks}, {"ep"});
    manual_seed(7);
    nn::MoEOptions o;
    o.num_experts = experts, o.top_k = 2, o.aux_loss_coef = 0.01;
    nn::Sequential layers;
    for (const char* name : {"a", "b"}) {
      auto moe = std::make_shared<nn::MoE>(16, 8, o, mesh);
      parallelize_module(*moe, mesh["ep"], {{"", ExpertParallel()}});
      layers.append(name, moe);
    }
    DTensor x = hp::randn({16, 16}, mesh, {Shard(0)});
    layers(x);
    for (nn::MoE* moe : nn::moe_layers(layers))
      logs[rank].layer_by_layer += moe->aux_loss()->full_tensor().item<double>();
    auto& log = comm::current_world()->collective_log();
    auto others = [&log] {  // than the counts and token all-to-alls
      std::vector<std::string> out;
      for (const auto& r : log.records())
        if (r.op != "all_to_all") out.push_back(r.to_string());
      log.clear();
      return out;
    };
    log.clear();
    log.enable();
    layers(x);
    logs[rank].forward = others();
    logs[rank].loss = nn::moe_aux_loss(layers)->full_tensor().item<double>();
    logs[rank].aux_loss = others();
    nn::update_expert_bias(layers);
    logs[rank].expert_loads = others();
    log.enable(false);
  });
  return logs;
}

}  // namespace

// The load-balancing loss reads two sums over the whole batch (assignments and scores per
// expert). A layer's forward leaves them partial, so that no collective besides the token
// exchange waits on its critical path; moe_aux_loss reduces every layer's in one
// all-reduce. The loads the expert bias follows go the same way: one for all layers. The
// loss is the one-process value on every rank.
TEST(ExpertParallel, AuxLossSumsOfAllLayersTakeOneAllReduce) {
  const int64_t experts = 4;
  const double one_process = collectives_beside_the_exchange(experts, 1).at(0).loss;
  for (const LoggedStep& log : collectives_beside_the_exchange(experts, 4)) {
    EXPECT_NEAR(log.loss, one_process, 1e-6 * one_process);
    EXPECT_NEAR(log.loss, log.layer_by_layer, 1e-6 * one_process);
    EXPECT_EQ(log.forward, std::vector<std::string>{});
    EXPECT_EQ(log.aux_loss, std::vector<std::string>{"all_reduce [0, 1, 2, 3] Float x " + std::to_string(2 * 2 * experts)});
    EXPECT_EQ(log.expert_loads, std::vector<std::string>{"all_reduce [0, 1, 2, 3] Float x " + std::to_string(2 * experts)});
  }
}

// Under sequence parallelism each rank routes only its own tokens: over ep 2 x tp 2 with
// the batch on ep and the sequence on tp, dispatch and combine move 2 * T * top_k * dim
// floats in all (T the global tokens, none counted twice), nothing is all-gathered, and
// the output keeps the input's layout.
TEST(ExpertParallel, SequenceParallelRoutesOnlyItsOwnTokens) {
  const int64_t b = 4, seq = 6, dim = 16, k = 2;
  std::vector<int64_t> float_numel(4);
  comm::run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"ep", "tp"});
    manual_seed(7);
    nn::MoEOptions o;
    o.num_experts = 4, o.top_k = k;
    nn::MoE moe(dim, 8, o, mesh);
    parallelize_module(moe, mesh["ep"], {{"", ExpertParallel()}});
    parallelize_module(moe, mesh["tp"], {{"", MoESequenceParallel()}});
    DTensor x = hp::randn({b, seq, dim}, mesh, {Shard(0), Shard(1)});
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    DTensor y = moe(x);
    log.enable(false);
    EXPECT_EQ(y.spec(), x.spec());
    for (const auto& r : log.records()) {
      EXPECT_NE(r.op, "all_gather") << r.to_string();
      if (r.op == "all_to_all" && r.dtype != at::kLong) float_numel[rank] += r.numel;
    }
  });
  EXPECT_EQ(float_numel[0] + float_numel[1] + float_numel[2] + float_numel[3], 2 * b * seq * k * dim);
}

TEST(ExpertParallel, BadConfigurationsAreRefused) {
  nn::MoEOptions o;
  o.num_experts = 4, o.top_k = 5;
  EXPECT_THROW(o.validate(), hp::Error);
  o.top_k = 2, o.num_expert_groups = 3, o.num_limited_groups = 1;
  EXPECT_THROW(o.validate(), hp::Error);  // 4 experts in 3 groups
  o.num_expert_groups = 2, o.num_limited_groups = 3;
  EXPECT_THROW(o.validate(), hp::Error);
  o.num_expert_groups = 0, o.num_limited_groups = 0, o.capacity_factor = -1;
  EXPECT_THROW(o.validate(), hp::Error);
  comm::run_local_ranks(4, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {4}, {"ep"});
    nn::MoEOptions few;
    few.num_experts = 2, few.top_k = 1;
    nn::MoE moe(16, 8, few, mesh);
    EXPECT_THROW(parallelize_module(moe, mesh["ep"], {{"", ExpertParallel()}}), hp::Error);  // 2 experts, 4 ranks
    nn::Linear lin(4, 4, mesh);
    EXPECT_THROW(parallelize_module(lin, mesh["ep"], {{"", ExpertParallel()}}), hp::Error);  // not a MoE
  });
}

// The grouped product against one product per group, on ATen's grouped kernel (float32,
// aligned rows) and on the fallback (float64, or rows the kernel cannot take), with empty
// groups; both give every group's weight a gradient.
TEST(GroupedMm, MatchesOneProductPerGroup) {
  manual_seed(3);
  const std::vector<int64_t> counts{3, 0, 5, 1};
  for (auto [dtype, k] : std::vector<std::pair<at::ScalarType, int64_t>>{{at::kFloat, 8}, {at::kDouble, 8}, {at::kFloat, 6}}) {
    at::Tensor x = hp::randn({9, k}, dtype).requires_grad_(true);
    at::Tensor w = hp::randn({4, 12, k}, dtype).requires_grad_(true);  // [G, M, K], used transposed
    at::Tensor y = nn::grouped_mm(x, w.transpose(1, 2), counts);
    at::Tensor xr = x.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
    std::vector<at::Tensor> pieces;
    int64_t start = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      pieces.push_back(xr.narrow(0, start, counts[g]).matmul(wr[g].t()));
      start += counts[g];
    }
    at::Tensor want = at::cat(pieces, 0);
    at::Tensor grad = hp::randn({9, 12}, dtype);
    y.backward(grad);
    want.backward(grad);
    EXPECT_TRUE(at::allclose(y, want, 1e-6, 1e-6)) << dtype << " k " << k;
    EXPECT_TRUE(at::allclose(x.grad(), xr.grad(), 1e-6, 1e-6)) << dtype << " k " << k;
    ASSERT_TRUE(w.grad().defined());
    EXPECT_TRUE(at::allclose(w.grad(), wr.grad(), 1e-6, 1e-6)) << dtype << " k " << k;
    EXPECT_EQ(w.grad()[1].abs().sum().item<double>(), 0.0);  // the empty group
  }
  EXPECT_THROW(nn::grouped_mm(hp::randn({9, 8}), hp::randn({4, 8, 12}), {3, 0, 5}), hp::Error);
}
