// fully_shard with an offload policy against the same fully_shard run without one, on the
// same model, seed and data: the loss of every step, every gradient of the first step and
// every parameter after 5 steps, bitwise on every rank (offload moves bytes, it changes no
// arithmetic). Layouts: fsdp 2, fsdp 3 (uneven shards; also bf16 mixed precision and FP8
// all-gather), fsdp 2 x tp 2, ZeRO-1/2/3 with gradient accumulation on 2 and 3 ranks;
// AdamW and Muon; the optimizer streaming parameters, gradients and state (SwapOptimizer)
// or stepping on everything brought in. Counted: the shards' and gradients' bytes leave
// memory. Errors: a vanished offload file, a full disk that loses nothing.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <mutex>
#include <optional>

#include "hp/optim/muon.h"
#include "hp/parallel/zero_stage.h"
#include "memory/llama_checkpoint.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

// Every test removes what it made (FileTier removes only its own directories).
std::vector<std::string> made_dirs;
std::mutex made_mu;
std::string fresh_dir() {
  char tmpl[] = "/tmp/hp_fsdp_offload_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp failed";
  std::lock_guard<std::mutex> lock(made_mu);
  made_dirs.push_back(tmpl);
  return tmpl;
}
struct RemoveMadeDirs : ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override {
    for (const std::string& d : made_dirs) std::filesystem::remove_all(d);
    made_dirs.clear();
  }
};
const bool remove_made_dirs = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new RemoveMadeDirs);
  return true;
}();

enum class Offload { None, Files, Host };
// Streamed: a SwapOptimizer given the offloaded parameters; BroughtIn: AdamW or Muon after
// FSDPModule::bring_in_offloaded().
enum class Step { Streamed, BroughtIn };

struct Case {
  std::vector<int64_t> mesh;
  bool tp = false;
  int zero = 0;  // a ZeRO stage over 2 micro-steps; 0: one step per batch
  bool muon = false;
  bool bf16 = false;  // mixed precision: bfloat16 gathers and compute, float32 reduction
  bool fp8 = false;   // FP8 Linears whose weights are gathered in FP8 (scales from the shards)
  Step step = Step::Streamed;
};

// This rank's root unit (ranks are threads).
std::optional<FSDPModule>& root() {
  thread_local std::optional<FSDPModule> r;
  return r;
}

using Factory = memory::OptimizerFactory;
// `batches_of`: the optimizer is made per batch of these; a Muon then splits the matrices
// that one Muon over all of them would.
Factory optimizer_factory(bool muon, const std::vector<DTensor*>* batches_of = nullptr) {
  if (muon) {
    optim::MuonOptions o;
    o.lr = 0.02;
    if (batches_of) {
      o.split_params = optim::muon_split_params(*batches_of, o);
      o.split = optim::MuonSplit::Listed;
    }
    return [o](std::vector<DTensor*> ps) -> std::unique_ptr<optim::Optimizer> {
      return std::make_unique<optim::Muon>(ps, o);
    };
  }
  return [](std::vector<DTensor*> ps) -> std::unique_ptr<optim::Optimizer> {
    optim::AdamWOptions o;
    o.lr = 1e-2, o.weight_decay = 0.1;
    return std::make_unique<optim::AdamW>(ps, o);
  };
}

std::vector<DTensor*> stepped(nn::Llama& m, bool muon) {
  if (!muon) return m.parameters();
  std::vector<DTensor*> matrices;  // Muon's: the blocks' 2-D weights
  for (auto& [name, p] : m.named_parameters())
    if (name.rfind("layers.", 0) == 0 && p->dim() == 2) matrices.push_back(p);
  return matrices;
}

LlamaRunSpec offload_spec(const Case& c, Offload offload) {
  LlamaRunSpec spec;
  spec.mesh_shape = c.mesh;
  if (c.tp) spec.mesh_names = {"dp", "tp"};
  spec.batch = 6;  // rows split over 1, 2 or 3 dp ranks
  if (c.zero) spec.batch = 12, spec.micro_steps = 2;
  const std::string dir = offload == Offload::Files ? fresh_dir() : "";
  spec.parallelize = [c, offload, dir](nn::Llama& model, const DeviceMesh& mesh) {
    if (c.tp) parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, /*loss_parallel=*/true});
    if (c.fp8) {
      LowPrecisionConfig lp;
      lp.enable_fsdp_float8_all_gather = true;
      apply_low_precision(model, lp);
    }
    FullyShardOptions o = c.zero ? zero_stage_options(c.zero) : FullyShardOptions{};
    if (c.bf16) o.mp_policy = {at::kBFloat16, at::kFloat};
    if (offload == Offload::Files) o.offload_policy = FileOffloadPolicy{dir};
    if (offload == Offload::Host) o.offload_policy = CPUOffloadPolicy{};
    root() = fully_shard_llama(model, mesh["dp"], o);
    std::function<void(bool)> sync;
    if (c.zero)
      sync = [stage = c.zero](bool last) { prepare_zero_backward(*root(), stage, last); };
    return sync;
  };
  spec.optimizer = [c, offload](nn::Llama& m) -> std::unique_ptr<optim::Optimizer> {
    const std::vector<DTensor*> params = stepped(m, c.muon);
    if (offload == Offload::None || c.step == Step::BroughtIn) return optimizer_factory(c.muon)(params);
    memory::SwapOptimizerOptions o;
    o.batch_bytes = 2048;  // several batches
    o.parameters = root()->offloaded_parameters();
    return std::make_unique<memory::SwapOptimizer>(params, optimizer_factory(c.muon, &params),
                                                    std::make_shared<memory::FileTier>(fresh_dir()), o);
  };
  if (offload != Offload::None) {
    // The first step's gradients are read (and, stepping in memory, every step's).
    spec.after_backward = [c](nn::Llama&, int64_t step) {
      if (step == 0 || c.step == Step::BroughtIn) root()->bring_in_offloaded();
    };
    spec.before_final = [](nn::Llama&) { root()->bring_in_offloaded(); };
  }
  return spec;
}

void expect_same_as_without(const Case& c, Offload offload = Offload::Files) {
  LlamaRun ref = hp::testing::train_llama(offload_spec(c, Offload::None));
  hp::testing::expect_identical(hp::testing::train_llama(offload_spec(c, offload)), ref);
}

}  // namespace

TEST(FsdpOffload, Files2Ranks) { expect_same_as_without({{2}}); }
TEST(FsdpOffload, Files3RanksUneven) { expect_same_as_without({{3}}); }
TEST(FsdpOffload, FilesFsdp2Tp2) { expect_same_as_without({{2, 2}, /*tp=*/true}); }
TEST(FsdpOffload, FilesSteppedInMemory3Ranks) {
  Case c{{3}};
  c.step = Step::BroughtIn;
  expect_same_as_without(c);
}
TEST(FsdpOffload, FilesMixedPrecision3Ranks) {
  Case c{{3}};
  c.bf16 = true;
  expect_same_as_without(c);
}
TEST(FsdpOffload, FilesFloat8AllGather3Ranks) {
  Case c{{3}};
  c.fp8 = true;
  expect_same_as_without(c);
}
TEST(FsdpOffload, HostMemory3Ranks) { expect_same_as_without({{3}}, Offload::Host); }
TEST(FsdpOffload, FilesZeroStagesWithAccumulation) {
  for (int world : {2, 3})
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", ZeRO-" + std::to_string(stage));
      Case c{{world}};
      c.zero = stage;
      expect_same_as_without(c);
    }
}
// Muon's exchanges run inside each batch's step, so every rank needs the same batches:
// uneven shards (3 ranks) must cut them alike too.
TEST(FsdpOffload, FilesMuon) {
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    Case c{{world}};
    c.muon = true;
    expect_same_as_without(c);
  }
}

// After a backward, the parameter shards and the gradient shards are out of memory: the
// tracked CPU bytes are lower by exactly their size (one rank: a shard is the parameter).
TEST(FsdpOffload, ShardsAndGradientsLeaveMemory) {
  auto allocated_after_backward = [](Offload offload, int64_t* shard_bytes) {
    int64_t held = 0;
    comm::run_local_ranks(1, [&](int) {
      track_cpu_memory();
      const int64_t start = cpu_memory_allocated();
      DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
      manual_seed(5);
      nn::Llama model(hp::testing::tiny_llama(), mesh);
      FullyShardOptions o;
      if (offload == Offload::Files) o.offload_policy = FileOffloadPolicy{fresh_dir()};
      FSDPModule r = fully_shard_llama(model, mesh["dp"], o);
      const at::Tensor tokens = (hp::rand({2, 9}, at::kDouble) * 32).floor().to(at::kLong);
      DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, {Replicate()});
      DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, {Replicate()});
      model.loss(ids, targets).to_local().backward();
      held = cpu_memory_allocated() - start;
      EXPECT_EQ(r.unsharded_bytes(), 0);
      if (offload == Offload::Files) {
        r.bring_in_offloaded();
        EXPECT_EQ(cpu_memory_allocated() - start, held + 2 * *shard_bytes);  // both came back
      } else {
        *shard_bytes = 0;
        for (DTensor* p : model.parameters()) *shard_bytes += static_cast<int64_t>(p->to_local().nbytes());
      }
    });
    return held;
  };
  int64_t shard_bytes = 0;
  allocated_after_backward(Offload::None, &shard_bytes);  // warms caches that outlive a run
  const int64_t in_memory = allocated_after_backward(Offload::None, &shard_bytes);
  const int64_t offloaded = allocated_after_backward(Offload::Files, &shard_bytes);
  EXPECT_GT(shard_bytes, 0);
  EXPECT_EQ(in_memory - offloaded, 2 * shard_bytes) << "in memory " << in_memory << ", offloaded " << offloaded;
}

// Clipping with the gradients in files streams them: the same norm and clipped gradients as
// without offload, bitwise, while the counted bytes never rise by the gradients' total (one
// parameter's gradient and its float64 squares at a time), and all of them are out again
// afterwards.
TEST(FsdpOffload, ClippingStreamsTheGradients) {
  comm::run_local_ranks(1, [](int) {
    track_cpu_memory();
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    const at::Tensor tokens = (hp::rand({2, 9}, at::kDouble) * 32).floor().to(at::kLong);
    DTensor ids = distribute_tensor(tokens.narrow(1, 0, 8).contiguous(), mesh, {Replicate()});
    DTensor targets = distribute_tensor(tokens.narrow(1, 1, 8).contiguous(), mesh, {Replicate()});
    auto backward = [&](nn::Llama& model) { model.loss(ids, targets).to_local().backward(); };

    manual_seed(5);
    nn::Llama plain(hp::testing::tiny_llama(), mesh);
    fully_shard_llama(plain, mesh["dp"]);
    backward(plain);
    const double want = optim::clip_grad_norm_(plain.parameters(), 1e-3);

    manual_seed(5);
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    FullyShardOptions o;
    o.offload_policy = FileOffloadPolicy{fresh_dir()};
    FSDPModule r = fully_shard_llama(model, mesh["dp"], o);
    backward(model);
    int64_t grad_bytes = 0, largest = 0;
    for (DTensor* p : model.parameters()) {
      grad_bytes += static_cast<int64_t>(p->to_local().nbytes());
      largest = std::max<int64_t>(largest, static_cast<int64_t>(p->to_local().nbytes()));
    }
    // One gradient, its float64 copy and their squares (2 + 2 times its bytes) at a time,
    // beside the norm's float64 scalars.
    const int64_t one_at_a_time = 5 * largest + 256;
    ASSERT_LT(one_at_a_time, grad_bytes);
    const int64_t before = cpu_memory_allocated();
    reset_cpu_memory_peak();
    const double got = optim::clip_grad_norm_(model.parameters(), 1e-3, nullptr, r.offloaded_parameters().get());
    EXPECT_EQ(got, want);
    EXPECT_GT(want, 1e-3);  // so the gradients were scaled
    EXPECT_LE(cpu_memory_peak() - before, one_at_a_time) << "of " << grad_bytes << " gradient bytes";
    EXPECT_EQ(cpu_memory_allocated(), before);
    r.bring_in_offloaded();
    const auto ps = plain.named_parameters(), ms = model.named_parameters();
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_TRUE(at::equal(ms[i].second->grad()->to_local(), ps[i].second->grad()->to_local())) << ps[i].first;
  });
}

// An optimizer stepping on the released shards instead of streaming them is refused by name.
TEST(FsdpOffload, PlainOptimizerOnReleasedShardsIsAnError) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(5);
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    FullyShardOptions o;
    o.offload_policy = FileOffloadPolicy{fresh_dir()};
    FSDPModule r = fully_shard_llama(model, mesh["dp"], o);
    DTensor ids = distribute_tensor(at::zeros({2, 8}, at::kLong), mesh, {Replicate()});
    model.loss(ids, ids).to_local().backward();
    optim::AdamW adamw(model.parameters());
    try {
      adamw.step();
      ADD_FAILURE() << "expected an error";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not in memory"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bring_in_offloaded"), std::string::npos) << e.what();
    }
    r.bring_in_offloaded();
    adamw.step();  // in memory again
  });
}

TEST(FsdpOffload, VanishedFileIsAnError) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(5);
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    FullyShardOptions o;
    const std::string dir = fresh_dir();
    o.offload_policy = FileOffloadPolicy{dir};
    fully_shard_llama(model, mesh["dp"], o);
    DTensor ids = distribute_tensor(at::zeros({2, 8}, at::kLong), mesh, {Replicate()});
    model.loss(ids, ids).to_local().backward();
    std::filesystem::remove_all(dir);
    try {
      model.loss(ids, ids);
      ADD_FAILURE() << "expected an error";
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be opened"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
    }
  });
}

namespace {

// Steps `inner`, and at step 1 on a disk too small for any file the optimizer writes:
// that step must throw, and keep what it could not write.
class FullDiskAtStep1 : public optim::Optimizer {
 public:
  FullDiskAtStep1(std::unique_ptr<optim::Optimizer> inner, std::atomic<int>* failures)
      : inner_(std::move(inner)), failures_(failures) {}
  void step() override {
    if (steps_++ != 1) return inner_->step();
    rlimit old;
    ::getrlimit(RLIMIT_FSIZE, &old);
    auto previous = std::signal(SIGXFSZ, SIG_IGN);
    rlimit tiny = old;
    tiny.rlim_cur = 32;  // below every parameter, gradient and state file
    ::setrlimit(RLIMIT_FSIZE, &tiny);
    try {
      inner_->step();
    } catch (const hp::Error& e) {
      if (std::string(e.what()).find("stays in memory") != std::string::npos) ++*failures_;
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
  }
  void zero_grad() override { inner_->zero_grad(); }
  void set_lr(double lr) override { inner_->set_lr(lr); }
  double lr() const override { return inner_->lr(); }
  std::vector<DTensor*> params() const override { return inner_->params(); }
  int64_t steps() const override { return inner_->steps(); }
  void set_steps(int64_t s) override { inner_->set_steps(s); }
  std::vector<optim::StateEntry> state() override { return inner_->state(); }

 private:
  std::unique_ptr<optim::Optimizer> inner_;
  std::atomic<int>* failures_;
  int steps_ = 0;
};

}  // namespace

// One rank (the file size limit is the process's): the run goes on after the failed step
// with the numbers of an uninterrupted one.
TEST(FsdpOffload, FullDiskIsAnErrorAndLosesNothing) {
  LlamaRunSpec ref = offload_spec({{1}}, Offload::None), spec = offload_spec({{1}}, Offload::Files);
  std::atomic<int> failures{0};
  auto streamed = spec.optimizer;
  spec.optimizer = [streamed, &failures](nn::Llama& m) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<FullDiskAtStep1>(streamed(m), &failures);
  };
  hp::testing::expect_identical(hp::testing::train_llama(spec), hp::testing::train_llama(ref));
  EXPECT_EQ(failures.load(), 1);
}
