// Deferred initialisation: a model built inside no_init_parameters(), sharded, then drawn
// by init_parameters holds, on every rank, the very shards of a model built whole and
// sharded the same way (bitwise), trains the same, and never holds the whole model.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>

#include "hp/checkpoint/state.h"
#include "hp/optim/adamw.h"
#include "hp/optim/muon.h"
#include "hp/parallel.h"
#include "hp/tensor/memory_stats.h"
#include "llama_run.h"

namespace hp {
namespace {

using testing::tiny_llama;

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  // Shards the model (no DDP: it reads the values, so it comes after init_parameters).
  std::function<void(nn::Llama&, const DeviceMesh&)> shard;
};

std::unique_ptr<nn::Llama> build(const DeviceMesh& mesh, bool deferred, const nn::LlamaConfig& c) {
  manual_seed(1234);
  if (!deferred) return std::make_unique<nn::Llama>(c, mesh);
  auto scope = no_init_parameters();  // the original HyperParallel's names, in hp::
  return std::make_unique<nn::Llama>(c, mesh);
}

std::unique_ptr<nn::Linear> deferred_linear(const DeviceMesh& mesh) {
  auto scope = no_init_parameters();
  return std::make_unique<nn::Linear>(3, 2, mesh);
}

// Rank by rank: the local shards, the RNG state after building, and two training steps' losses.
struct View {
  std::map<std::string, at::Tensor> shards;
  RngState after_build;
  std::vector<double> losses;
};

View run(const Layout& layout, bool deferred) {
  int world = 1;
  for (int64_t s : layout.shape) world *= static_cast<int>(s);
  std::vector<View> views(world);
  std::mutex mu;
  comm::run_local_ranks(world, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", layout.shape, layout.names);
    nn::LlamaConfig c = tiny_llama();
    std::unique_ptr<nn::Llama> model = build(mesh, deferred, c);
    View v;
    v.after_build = get_rng_state();
    layout.shard(*model, mesh);
    if (deferred) init_parameters(*model);
    for (auto& [name, p] : model->named_parameters()) v.shards[name] = p->to_local().detach().clone();
    optim::AdamW opt(model->parameters(), testing::adamw_options());
    manual_seed(99);
    const at::Tensor tokens = (hp::rand({4, 9}, at::kDouble) * c.vocab).floor().to(at::kLong);
    std::vector<Placement> rows(mesh.ndim(), Replicate());
    for (int k = 0; k < mesh.ndim(); ++k)
      if (layout.names[k] == "dp") rows[k] = Shard(0);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, rows);
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, rows);
    for (int step = 0; step < 2; ++step) {
      DTensor loss = model->loss(ids, targets);
      loss.to_local().backward();
      v.losses.push_back(loss.full_tensor().item<double>());
      opt.step();
      opt.zero_grad();
    }
    std::lock_guard<std::mutex> lock(mu);
    views[rank] = std::move(v);
  });
  // Every rank's shards and losses in one view, keyed by rank.
  View all;
  for (int r = 0; r < world; ++r) {
    for (auto& [name, t] : views[r].shards) all.shards["rank" + std::to_string(r) + " " + name] = t;
    all.losses.insert(all.losses.end(), views[r].losses.begin(), views[r].losses.end());
  }
  all.after_build = views[0].after_build;
  return all;
}

std::vector<Layout> layouts() {
  auto tp = [](nn::Llama& m, const DeviceMesh& mesh) { parallelize_llama(m, mesh["tp"], {true, true}); };
  auto fsdp = [](nn::Llama& m, const DeviceMesh& mesh) { fully_shard_llama(m, mesh["dp"]); };
  return {
      {"one_rank", {1}, {"dp"}, [](nn::Llama&, const DeviceMesh&) {}},
      {"tp2", {2}, {"tp"}, tp},
      {"fsdp2", {2}, {"dp"}, fsdp},
      {"fsdp3_uneven", {3}, {"dp"}, fsdp},
      {"fsdp2_x_tp2", {2, 2}, {"dp", "tp"},
       [=](nn::Llama& m, const DeviceMesh& mesh) {
         tp(m, mesh);
         fsdp(m, mesh);
       }},
  };
}

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

class DeferredInit : public ::testing::TestWithParam<Layout> {};

TEST_P(DeferredInit, EveryRankHoldsTheShardsOfAModelBuiltWholeAndTrainsTheSame) {
  const View eager = run(GetParam(), false);
  const View deferred = run(GetParam(), true);
  ASSERT_EQ(deferred.shards.size(), eager.shards.size());
  for (auto& [name, t] : eager.shards) {
    ASSERT_TRUE(deferred.shards.count(name)) << name;
    const at::Tensor& got = deferred.shards.at(name);
    ASSERT_EQ(got.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(got, t)) << name << " differs: max abs diff " << (got - t).abs().max().item<double>();
  }
  // Later draws (dropout, data) see the RNG where an eager build leaves it.
  EXPECT_EQ(deferred.after_build.seed, eager.after_build.seed);
  EXPECT_EQ(deferred.after_build.offset, eager.after_build.offset);
  EXPECT_EQ(deferred.losses, eager.losses);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeferredInit, ::testing::ValuesIn(layouts()),
                         [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

// A Linear's zero bias and a norm's ones are deferred too.
TEST(DeferredInitLayers, BiasesAndNormsAreDrawnAsBuilt) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(5);
    nn::Linear eager_linear(6, 4, mesh, /*bias=*/true);
    nn::RMSNorm eager_norm(6, mesh);
    manual_seed(5);
    std::unique_ptr<nn::Linear> linear;
    std::unique_ptr<nn::RMSNorm> norm;
    {
      auto scope = nn::no_init_parameters();
      linear = std::make_unique<nn::Linear>(6, 4, mesh, true);
      norm = std::make_unique<nn::RMSNorm>(6, mesh);
    }
    EXPECT_TRUE(linear->weight().to_local().is_meta());
    nn::init_parameters(*linear);
    nn::init_parameters(*norm);
    EXPECT_TRUE(at::equal(linear->weight().to_local(), eager_linear.weight().to_local()));
    EXPECT_TRUE(at::equal(linear->bias()->to_local(), at::zeros({4})));
    EXPECT_TRUE(at::equal(norm->param("weight").to_local(), at::ones({6})));
    EXPECT_TRUE(linear->weight().requires_grad());
  });
}

// Whatever would read a parameter before init_parameters says so, naming the way out.
TEST(DeferredInitLayers, UseBeforeInitParametersIsRefusedNamingIt) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    std::unique_ptr<nn::Linear> linear = deferred_linear(mesh);
    DTensor x = distribute_tensor(at::ones({1, 3}), mesh, {Replicate()});
    auto expect_refused = [](const std::function<void()>& f, const std::string& who) {
      try {
        f();
        ADD_FAILURE() << who << " ran on a parameter not drawn yet";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("init_parameters"), std::string::npos) << who << ": " << e.what();
      }
    };
    expect_refused([&] { (*linear)(x); }, "forward");
    expect_refused([&] { optim::AdamW opt(linear->parameters()); }, "AdamW");
    expect_refused([&] { optim::Muon opt({&linear->weight()}); }, "Muon");
    expect_refused([&] { DistributedDataParallel ddp(*linear, mesh); }, "DDP");
    expect_refused([&] { checkpoint::State().add_module(*linear); }, "a checkpoint's state");
    nn::init_parameters(*linear);
    EXPECT_EQ((*linear)(x).to_local().sizes(), (std::vector<int64_t>{1, 2}));
  });
}

// An offload policy sends each shard out as fully_shard makes it: a shard with no values
// yet is refused there, not written out.
TEST(DeferredInitLayers, OffloadingAShardNotDrawnYetIsRefused) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    std::unique_ptr<nn::Linear> linear = deferred_linear(mesh);
    FullyShardOptions o;
    o.offload_policy = FileOffloadPolicy{::testing::TempDir() + "deferred_offload"};
    try {
      fully_shard(*linear, mesh, o);
      ADD_FAILURE() << "fully_shard offloaded a shard with no values";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("before fully_shard when offloading"), std::string::npos) << e.what();
    }
  });
}

// Built deferred and fully sharded over 4 ranks, the job never holds more than about one
// model's bytes in all (its shards); built whole first, every rank holds the whole model.
TEST(DeferredInitLayers, FullyShardedRanksNeverHoldTheWholeModel) {
  nn::LlamaConfig c = tiny_llama();
  c.dim = 64, c.ffn_dim = 192, c.layers = 4, c.vocab = 512;
  track_cpu_memory();
  auto peak_of_building = [&](bool deferred) {
    std::mutex mu;
    int64_t model_bytes = 0;
    reset_cpu_memory_peak();
    const int64_t before = cpu_memory_allocated();
    int64_t peak = 0;
    comm::run_local_ranks(4, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {4}, {"dp"});
      std::unique_ptr<nn::Llama> model = build(mesh, deferred, c);
      // Every rank's model built before any is sharded, as when each rank is a process of
      // its own: rank threads that took turns would never hold four at once.
      comm::barrier(mesh.whole_group());
      fully_shard_llama(*model, mesh["dp"]);
      if (deferred) nn::init_parameters(*model);
      comm::barrier(mesh.whole_group());
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        peak = cpu_memory_peak() - before;
        for (DTensor* p : model->parameters()) {
          int64_t n = 4;  // float32
          for (int64_t d : p->sizes()) n *= d;
          model_bytes += n;
        }
      }
    });
    return std::make_pair(peak, model_bytes);
  };
  const auto [whole_peak, model_bytes] = peak_of_building(false);
  const auto [deferred_peak, same_bytes] = peak_of_building(true);
  ASSERT_EQ(model_bytes, same_bytes);
  EXPECT_GT(whole_peak, 3 * model_bytes) << "four ranks each built the whole model";
  EXPECT_LT(deferred_peak, model_bytes * 3 / 2) << "deferred: " << deferred_peak << " B at the peak, model "
                                                << model_bytes << " B";
}

}  // namespace
}  // namespace hp
