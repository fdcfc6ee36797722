// DistributedDataParallel (bucketed all-reduce during backward) against the single-process
// model on the same numbers: loss every step, every gradient of the first step, every
// parameter after 5 steps. float32: relative 1e-5.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "comm/scoped_env.h"
#include "parallel/llama_run.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

LlamaRunSpec ddp_spec(std::vector<int64_t> shape, std::vector<std::string> names, DDPOptions o = {}) {
  LlamaRunSpec spec;
  spec.mesh_shape = shape, spec.mesh_names = names;
  spec.parallelize = [names, o](nn::Llama& model, const DeviceMesh& mesh) {
    if (names.back() == "tp") parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, true});
    auto ddp = std::make_shared<DistributedDataParallel>(model, mesh["dp"], o);
    return std::function<void(bool)>([ddp](bool on) { ddp->set_requires_gradient_sync(on); });
  };
  return spec;
}

// Buckets of about one parameter each.
DDPOptions small_buckets() {
  DDPOptions o;
  o.bucket_cap_mb = 0.001;
  return o;
}

}  // namespace

TEST(DistributedDataParallel, Dp4) {
  hp::testing::expect_runs_match(hp::testing::train_llama(ddp_spec({4}, {"dp"})), hp::testing::train_llama({}));
}

// Buckets of one parameter or so: many all-reduces in flight, the same numbers.
TEST(DistributedDataParallel, SmallBucketsTimesSequenceParallel) {
  hp::testing::expect_runs_match(hp::testing::train_llama(ddp_spec({2, 2}, {"dp", "tp"}, small_buckets())),
                                 hp::testing::train_llama({}));
}

// The buckets live in the group's symmetric heap, and with 4 KiB steps (HP_SHM_STEP_KIB)
// they are above the one-shot size: the all-reduce reads them in place, the same numbers.
TEST(DistributedDataParallel, SymmetricBucketsReducedInPlace) {
  hp::testing::LlamaRun run;
  {
    ScopedEnv small("HP_SHM_STEP_KIB", "4");
    run = hp::testing::train_llama(ddp_spec({4}, {"dp"}));
  }
  hp::testing::expect_runs_match(run, hp::testing::train_llama({}));
}

TEST(DistributedDataParallel, GradientAccumulationEqualsLargeBatch) {
  LlamaRunSpec spec = ddp_spec({2}, {"dp"});
  spec.batch = 8;
  spec.micro_steps = 4;
  LlamaRunSpec ref;
  ref.batch = 8;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), hp::testing::train_llama(ref));
}

TEST(DistributedDataParallel, TiedEmbeddingsAndMuon) {
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2;
  auto muon_adamw = [adamw](nn::Llama& model) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::ChainedOptimizer>(optim::get_hyper_optimizer(model, optim::MuonOptions{}, adamw));
  };
  LlamaRunSpec spec = ddp_spec({4}, {"dp"}), ref;
  spec.tied = ref.tied = true;
  spec.optimizer = ref.optimizer = muon_adamw;
  hp::testing::expect_runs_match(hp::testing::train_llama(spec), hp::testing::train_llama(ref));
}

TEST(DistributedDataParallel, BucketsFollowTheCap) {
  comm::run_local_ranks(2, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"dp"});
    nn::Llama a(hp::testing::tiny_llama(), mesh), b(hp::testing::tiny_llama(), mesh);
    EXPECT_EQ(DistributedDataParallel(a, mesh).num_buckets(), 1);
    EXPECT_GT(DistributedDataParallel(b, mesh, small_buckets()).num_buckets(), 10);
    nn::Llama c(hp::testing::tiny_llama(), mesh);
    EXPECT_THROW(DistributedDataParallel(c, init_device_mesh("cpu", {2}, {"x"})), hp::Error);
  });
}

// Across hosts buckets shrink until the gradients fill min_buckets of them, so that the
// transfers overlap backward; inside a host they follow the caps alone (the first bucket
// capped low here, the rest in one).
TEST(DistributedDataParallel, BucketsShrinkAcrossHostsOnly) {
  for (int ranks_per_host : {2, 1}) {
    comm::run_local_ranks(
        2,
        [&](int) {
          DeviceMesh mesh = init_device_mesh("cpu", {2}, {"dp"});
          nn::Llama a(hp::testing::tiny_llama(), mesh), b(hp::testing::tiny_llama(), mesh);
          DDPOptions first_small;
          first_small.first_bucket_cap_mb = 0.001;
          first_small.min_bucket_mb = 0.001;
          DDPOptions caps = first_small;
          caps.min_buckets = 0;
          const int shrunk = DistributedDataParallel(a, mesh, first_small).num_buckets();
          const int caps_only = DistributedDataParallel(b, mesh, caps).num_buckets();
          EXPECT_EQ(caps_only, 2);
          if (ranks_per_host == 2) EXPECT_EQ(shrunk, 2);
          else EXPECT_GE(shrunk, 8);
        },
        std::chrono::seconds(60), ranks_per_host);
  }
}

// Across hosts buckets shrink no smaller than min_bucket_mb: with the floor under an
// eighth of the gradients min_buckets rules, with a quarter fewer buckets come, and with
// all of them the first bucket (capped low here) and one more.
TEST(DistributedDataParallel, BucketsAcrossHostsShrinkNoSmallerThanTheFloor) {
  comm::run_local_ranks(
      2,
      [&](int) {
        DeviceMesh mesh = init_device_mesh("cpu", {2}, {"dp"});
        auto buckets = [&](double floor_share) {
          nn::Llama model(hp::testing::tiny_llama(), mesh);
          double total = 0;
          for (auto& [name, p] : model.named_parameters())
            total += double(p->to_local().numel() * p->to_local().element_size());
          DDPOptions o;
          o.first_bucket_cap_mb = 0.001;
          o.min_bucket_mb = floor_share * total / (1 << 20);
          return DistributedDataParallel(model, mesh, o).num_buckets();
        };
        const int under_an_eighth = buckets(1.0 / 64), quarter = buckets(0.25), all = buckets(1.0);
        EXPECT_GE(under_an_eighth, 8);
        EXPECT_LT(quarter, under_an_eighth);
        EXPECT_EQ(all, 2);
      },
      std::chrono::seconds(60), /*ranks_per_host=*/1);
}

// The gradients that set the across-host bucket size are those DDP reduces: experts
// sharded over the DDP dim (here 8x the rest) hold other parameters on each rank and are
// in no bucket, so they must not make the buckets larger (too few to overlap backward).
TEST(DistributedDataParallel, BucketsAcrossHostsCountOnlyReducedGradients) {
  comm::run_local_ranks(
      2,
      [&](int) {
        DeviceMesh mesh = init_device_mesh("cpu", {2}, {"ep"});
        nn::MoELlamaConfig c = hp::testing::tiny_moe_llama();
        c.moe_hidden_dim = 1024;
        nn::MoELlama model(c, mesh);
        expert_parallelize_moe_llama(model, mesh["ep"]);
        int64_t experts = 0, others = 0;
        for (auto& [name, p] : model.named_parameters())
          (name.find(".experts.") != std::string::npos ? experts : others) += p->to_local().numel();
        ASSERT_GT(experts, 4 * others);
        DDPOptions o;
        o.first_bucket_cap_mb = o.min_bucket_mb = 0.001;
        EXPECT_GE(DistributedDataParallel(model, mesh, o).num_buckets(), o.min_buckets);
      },
      std::chrono::seconds(60), /*ranks_per_host=*/1);
}

// Replicas that initialise differently (each rank its own seed) start equal: every rank's
// parameters are those of its data-parallel group's rank 0, bitwise, alone (3 ranks) and
// beside tensor parallelism (the tp pieces differ; each dp group holds one of them).
TEST(DistributedDataParallel, ReplicasStartFromTheFirstOnes) {
  for (auto [shape, names] : {std::pair<std::vector<int64_t>, std::vector<std::string>>{{3}, {"dp"}},
                              {{2, 2}, {"dp", "tp"}}}) {
    const int world = static_cast<int>(shape[0] * (shape.size() > 1 ? shape[1] : 1));
    std::vector<std::map<std::string, at::Tensor>> locals(world);
    std::mutex mu;
    comm::run_local_ranks(world, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", shape, names);
      manual_seed(100 + rank);
      nn::Llama model(hp::testing::tiny_llama(), mesh);
      if (names.back() == "tp") parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, true});
      DistributedDataParallel ddp(model, mesh["dp"]);
      std::lock_guard<std::mutex> lock(mu);
      for (auto& [name, p] : model.named_parameters()) locals[rank][name] = p->to_local().detach().clone();
    });
    const int tp = shape.size() > 1 ? static_cast<int>(shape[1]) : 1;
    for (int rank = 0; rank < world; ++rank)
      for (auto& [name, t] : locals[rank])
        EXPECT_TRUE(at::equal(t, locals[rank % tp][name])) << "rank " << rank << " " << name << " on " << names.size() << "-D mesh";
  }
}
