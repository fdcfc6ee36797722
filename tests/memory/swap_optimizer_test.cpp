// SwapOptimizer (optimizer state in files or host memory between steps, streamed in byte-balanced batches)
// against the same optimizer kept in memory, on the same model, seed and data: the loss of
// every step, every gradient of the first step and every parameter after 5 steps, bitwise
// on every rank (the inner optimizers update each parameter from its own state, as the
// whole one does). AdamW and Muon; one process and fully_shard over 3 ranks (uneven
// shards); with and without prefetch. Errors: a file removed under the run, a full disk
// (a file size limit) that loses no state.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "hp/optim/muon.h"
#include "memory/llama_checkpoint.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

std::string fresh_dir() {
  char tmpl[] = "/tmp/hp_swap_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp failed";
  return tmpl;
}

optim::AdamWOptions adamw_options() {
  optim::AdamWOptions o;
  o.lr = 1e-2, o.weight_decay = 0.1;
  return o;
}

memory::OptimizerFactory adamw() {
  return [](std::vector<DTensor*> ps) { return std::make_unique<optim::AdamW>(ps, adamw_options()); };
}

enum class Tier { None, Files, Host };

LlamaRunSpec with_optimizer(LlamaRunSpec spec, Tier tier, memory::SwapOptimizerOptions o = {}) {
  spec.optimizer = [tier, o](nn::Llama& m) -> std::unique_ptr<optim::Optimizer> {
    if (tier == Tier::None) return adamw()(m.parameters());
    std::shared_ptr<memory::StorageTier> store;
    if (tier == Tier::Files) store = std::make_shared<memory::FileTier>(fresh_dir());
    else store = std::make_shared<memory::HostTier>();
    return std::make_unique<memory::SwapOptimizer>(m.parameters(), adamw(), store, o);
  };
  return spec;
}

void expect_same_as_in_memory(hp::testing::Layout layout, memory::SwapOptimizerOptions o, Tier tier = Tier::Files) {
  LlamaRunSpec base = hp::testing::checkpointed_llama(layout, {});
  LlamaRun ref = hp::testing::train_llama(with_optimizer(base, Tier::None));
  hp::testing::expect_identical(hp::testing::train_llama(with_optimizer(base, tier, o)), ref);
}

memory::SwapOptimizerOptions batches_of(int64_t bytes, bool prefetch = true, bool write_behind = true) {
  memory::SwapOptimizerOptions o;
  o.batch_bytes = bytes;
  o.prefetch = prefetch;
  o.write_behind = write_behind;
  return o;
}

}  // namespace

TEST(SwapOptimizer, AdamWSingleProcess) { expect_same_as_in_memory(hp::testing::Layout::Single, batches_of(4096)); }
TEST(SwapOptimizer, AdamWSingleProcessNoPrefetch) {
  expect_same_as_in_memory(hp::testing::Layout::Single, batches_of(4096, false));
}
TEST(SwapOptimizer, AdamWSingleProcessNoWriteBehind) {
  expect_same_as_in_memory(hp::testing::Layout::Single, batches_of(4096, true, false));
}
TEST(SwapOptimizer, AdamWFsdp3Uneven) { expect_same_as_in_memory(hp::testing::Layout::Fsdp3, batches_of(2048)); }
TEST(SwapOptimizer, AdamWFsdp3UnevenInHostMemory) {
  expect_same_as_in_memory(hp::testing::Layout::Fsdp3, batches_of(2048), Tier::Host);
}

TEST(SwapOptimizer, MuonSingleProcess) {
  auto muon = [](std::vector<DTensor*> ps) {
    optim::MuonOptions o;
    o.lr = 0.02;
    return std::make_unique<optim::Muon>(ps, o);
  };
  LlamaRunSpec base;
  base.optimizer = [muon](nn::Llama& m) -> std::unique_ptr<optim::Optimizer> {
    std::vector<DTensor*> matrices;
    for (auto& [name, p] : m.named_parameters())
      if (name.rfind("layers.", 0) == 0 && p->dim() == 2) matrices.push_back(p);
    return muon(matrices);
  };
  LlamaRun ref = hp::testing::train_llama(base);
  LlamaRunSpec swapped = base;
  swapped.optimizer = [muon](nn::Llama& m) -> std::unique_ptr<optim::Optimizer> {
    std::vector<DTensor*> matrices;
    for (auto& [name, p] : m.named_parameters())
      if (name.rfind("layers.", 0) == 0 && p->dim() == 2) matrices.push_back(p);
    return std::make_unique<memory::SwapOptimizer>(matrices, muon, std::make_shared<memory::FileTier>(fresh_dir()),
                                                    batches_of(4096));
  };
  hp::testing::expect_identical(hp::testing::train_llama(swapped), ref);
}

namespace {

// One parameter of 64 floats, a gradient of ones, in its own world.
struct Tiny {
  DTensor w;
  Tiny(const DeviceMesh& mesh) : w(randn({4, 16}, mesh, {Replicate()})) { w.requires_grad_(); }
  void grad() { w.to_local().mutable_grad() = at::ones_like(w.to_local()); }
};

}  // namespace

TEST(SwapOptimizer, BatchesAreByteBalancedAndStateLeavesMemory) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(2);
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    int64_t total = 0;
    for (DTensor* p : model.parameters()) total += p->to_local().nbytes();
    memory::SwapOptimizer opt(model.parameters(), adamw(), std::make_shared<memory::FileTier>(fresh_dir()),
                              batches_of(total / 4));
    EXPECT_EQ(opt.num_batches(), 4);
    EXPECT_EQ(opt.resident_bytes(), 0);
    EXPECT_EQ(static_cast<int64_t>(opt.state().size()), 2 * static_cast<int64_t>(model.parameters().size()));
    EXPECT_EQ(opt.resident_bytes(), 2 * total);  // state() brings everything back for a checkpoint
    opt.step();
    EXPECT_EQ(opt.resident_bytes(), 0);
  });
}

TEST(SwapOptimizer, RemovedFileIsAnError) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(2);
    Tiny t(mesh);
    auto tier = std::make_shared<memory::FileTier>(fresh_dir());
    memory::SwapOptimizer opt({&t.w}, adamw(), tier);
    t.grad();
    opt.step();
    std::filesystem::remove_all(tier->dir());
    try {
      opt.step();
      ADD_FAILURE() << "expected an error";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be opened"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(tier->dir()), std::string::npos) << e.what();
    }
  });
}

// A file size limit stands for a full disk: the write fails, the state stays in memory,
// and once there is room again the run goes on with the numbers of an uninterrupted one.
TEST(SwapOptimizer, FullDiskIsAnErrorAndLosesNoState) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(2);
    Tiny a(mesh);
    DTensor b_w = DTensor(a.w.to_local().detach().clone(), mesh, a.w.spec());
    b_w.requires_grad_();
    optim::AdamW ref({&b_w}, adamw_options());
    memory::SwapOptimizer opt({&a.w}, adamw(), std::make_shared<memory::FileTier>(fresh_dir()));

    rlimit old;
    ::getrlimit(RLIMIT_FSIZE, &old);
    auto previous = std::signal(SIGXFSZ, SIG_IGN);
    rlimit tiny = old;
    tiny.rlim_cur = 100;  // below one state file (256 bytes)
    ::setrlimit(RLIMIT_FSIZE, &tiny);
    a.grad();
    bool failed = false;
    try {
      opt.step();
    } catch (const hp::Error& e) {
      failed = true;
      EXPECT_NE(std::string(e.what()).find("stays in memory"), std::string::npos) << e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
    EXPECT_TRUE(failed);

    b_w.to_local().mutable_grad() = at::ones_like(b_w.to_local());
    ref.step();
    a.grad(), b_w.to_local().mutable_grad() = at::ones_like(b_w.to_local());
    opt.step();
    ref.step();
    EXPECT_TRUE(at::equal(a.w.to_local(), b_w.to_local()));
    auto got = opt.state(), want = ref.state();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(*got[i].local, *want[i].local)) << got[i].name;
  });
}
