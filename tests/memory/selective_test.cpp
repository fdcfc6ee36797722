// Selective activation checkpointing (a per-op policy, or a memory budget) against the same
// run without checkpointing, on the same layout, seed and data: the loss of every step,
// every gradient of the first step and every parameter after 5 AdamW steps, bitwise on
// every rank (the backward runs the forward's own graph on replayed values). Layouts: one
// process, tp=2 (sequence and loss parallel), fully_shard over 3 ranks (uneven), fully_shard
// x tp on 2x2. Also: what each mode keeps, collectives not issued twice, the errors, and
// swap_wrapper (every activation to files or host memory and back) with the host tier.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <stdlib.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "hp/tensor/fused_cpu.h"
#include "hp/tensor/memory_stats.h"
#include "memory/llama_checkpoint.h"

using namespace hp;
using hp::testing::expect_same_as_without;
using hp::testing::kept_after_forward;
using hp::testing::Layout;

namespace {

const std::vector<std::string> kBlocks{"layers.*"};

CheckpointOptions selective() {
  CheckpointOptions o;
  o.policy = save_matmuls_and_collectives;
  return o;
}

CheckpointOptions budget(double fraction) {
  CheckpointOptions o;
  o.memory_budget = fraction;
  return o;
}

CheckpointOptions policy(CheckpointPolicy p) {
  CheckpointOptions o;
  o.policy = [p](const CheckpointOp&) { return p; };
  return o;
}

// The small regions below read two products' weights, a factor s and an input x ([64, 32]),
// all needing gradients, drawn in that order.
struct SmallRegionTensors {
  DTensor w1, w2, s, x;
};

SmallRegionTensors small_region_tensors(const DeviceMesh& mesh, uint64_t seed, std::vector<int64_t> w1,
                                        std::vector<int64_t> w2) {
  manual_seed(seed);
  SmallRegionTensors t{hp::randn(w1, mesh, {Replicate()}), hp::randn(w2, mesh, {Replicate()}),
                       hp::randn({64, 32}, mesh, {Replicate()}), hp::randn({64, 32}, mesh, {Replicate()})};
  for (DTensor* d : {&t.w1, &t.w2, &t.s, &t.x}) d->requires_grad_();
  return t;
}

// Their gradients, each then zeroed for the next run.
std::vector<at::Tensor> take_grads(SmallRegionTensors& t) {
  std::vector<at::Tensor> g;
  for (DTensor* p : {&t.w1, &t.w2, &t.s, &t.x}) {
    g.push_back(p->to_local().grad().clone());
    p->to_local().mutable_grad().zero_();
  }
  return g;
}

}  // namespace

TEST(SelectiveCheckpoint, SingleProcess) { expect_same_as_without(Layout::Single, kBlocks, selective()); }
TEST(SelectiveCheckpoint, Tp2) { expect_same_as_without(Layout::Tp2, kBlocks, selective()); }
TEST(SelectiveCheckpoint, Fsdp3Uneven) { expect_same_as_without(Layout::Fsdp3, kBlocks, selective()); }
TEST(SelectiveCheckpoint, Fsdp2Tp2) { expect_same_as_without(Layout::Fsdp2Tp2, kBlocks, selective()); }
TEST(SelectiveCheckpoint, RecomputeEverythingSingleProcess) {
  expect_same_as_without(Layout::Single, kBlocks, policy(CheckpointPolicy::MUST_RECOMPUTE));
}
TEST(SelectiveCheckpoint, Budget50Tp2) { expect_same_as_without(Layout::Tp2, kBlocks, budget(0.5)); }
TEST(SelectiveCheckpoint, Budget50Fsdp3Uneven) { expect_same_as_without(Layout::Fsdp3, kBlocks, budget(0.5)); }

// MUST_SWAP for the matmuls: their outputs go to files after the forward and come back in
// the replay; the numbers are those of the run without checkpointing.
CheckpointOptions swap_matmuls() {
  CheckpointOptions o;
  o.policy = [](const CheckpointOp& op) {
    return op.is_matmul() ? CheckpointPolicy::MUST_SWAP : save_matmuls_and_collectives(op);
  };
  char tmpl[] = "/tmp/hp_act_swap_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp";
  o.swap_tier = std::make_shared<memory::FileTier>(tmpl);
  return o;
}

// A budget with a swap tier: the products it does not keep go to files, the rest is
// recomputed from them.
CheckpointOptions budget_swapping(double fraction) {
  CheckpointOptions o = budget(fraction);
  char tmpl[] = "/tmp/hp_act_swap_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp";
  o.swap_tier = std::make_shared<memory::FileTier>(tmpl);
  return o;
}

TEST(SelectiveCheckpoint, SwapMatmulsSingleProcess) { expect_same_as_without(Layout::Single, kBlocks, swap_matmuls()); }
TEST(SelectiveCheckpoint, Budget40SwappingSingleProcess) {
  expect_same_as_without(Layout::Single, kBlocks, budget_swapping(0.4));
}
TEST(SelectiveCheckpoint, Budget40SwappingTp2) { expect_same_as_without(Layout::Tp2, kBlocks, budget_swapping(0.4)); }
TEST(SelectiveCheckpoint, Budget40SwappingFsdp3Uneven) {
  expect_same_as_without(Layout::Fsdp3, kBlocks, budget_swapping(0.4));
}
TEST(SelectiveCheckpoint, SwapMatmulsTp2) { expect_same_as_without(Layout::Tp2, kBlocks, swap_matmuls()); }

// A policy sees each op by the function the model called: the fused kernels borrow
// another op's sharding rule (rms_norm and swiglu mul's, rotary softmax's), not its name.
TEST(SelectiveCheckpoint, PolicySeesTheFunctionsTheModelCalled) {
  std::set<std::string> names;
  CheckpointOptions o;
  o.policy = [&names](const CheckpointOp& op) {
    names.insert(op.name);
    return save_matmuls_and_collectives(op);
  };
  kept_after_forward(kBlocks, o);
  for (const char* name : {"linear", "attention", "rotary", "add"}) EXPECT_TRUE(names.count(name)) << name;
  if (fused::enabled())
    for (const char* name : {"rms_norm", "swiglu"}) EXPECT_TRUE(names.count(name)) << name;
  for (const std::string& name : names)
    EXPECT_TRUE(name.rfind("softmax", 0) != 0 && name != "mul") << "a block has no " << name << " of its own";
}

TEST(SelectiveCheckpoint, KeepsBetweenFullAndNone) {
  const int64_t none = kept_after_forward({});
  const int64_t full = kept_after_forward(kBlocks);
  const int64_t sel = kept_after_forward(kBlocks, selective());
  const int64_t half = kept_after_forward(kBlocks, budget(0.5));
  const int64_t nothing = kept_after_forward(kBlocks, policy(CheckpointPolicy::MUST_RECOMPUTE));
  const int64_t all = kept_after_forward(kBlocks, policy(CheckpointPolicy::MUST_SAVE));
  const int64_t swapped = kept_after_forward(kBlocks, swap_matmuls());
  const std::string figures = "none " + std::to_string(none) + ", full " + std::to_string(full) + ", selective " +
                              std::to_string(sel) + ", budget 0.5 " + std::to_string(half) + ", recompute all " +
                              std::to_string(nothing) + ", save all " + std::to_string(all) + ", swap matmuls " +
                              std::to_string(swapped);
  EXPECT_LT(full, sel) << figures;
  EXPECT_LT(sel, none) << figures;
  EXPECT_LT(nothing, sel) << figures;
  EXPECT_LT(half, none) << figures;
  EXPECT_GE(all, none) << figures;  // every output kept, some beyond what autograd would save
  EXPECT_LT(swapped, sel) << figures;  // the kept matmul outputs are in files
}

// A budget is a share of the bytes autograd reads, spent on outputs that may be read: the
// region's last product, which only its result reads, takes none of it. Here x w1 (read by
// the mul's backward) and the mul's output (read by the last product's) are 8 KiB each,
// so half fits x w1 exactly, with the last product (2 KiB) left out.
TEST(SelectiveCheckpoint, ABudgetSpendsNothingOnOutputsNothingReads) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 2, {32, 32}, {8, 32});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    track_cpu_memory();
    const int64_t before = cpu_memory_allocated();
    DTensor out = memory::checkpoint([&](const DTensor& in) { return linear(mul(linear(in, w1), s), w2); }, x,
                                     {&w1, &w2, &s}, budget(0.5));
    const int64_t kept = cpu_memory_allocated() - before - 64 * 8 * 4;  // less the result
    EXPECT_GE(kept, 64 * 32 * 4) << "x w1 not kept";
    EXPECT_LT(kept, 2 * 64 * 32 * 4) << "more than the budget kept";
    out.to_local().sum().backward();
    EXPECT_TRUE(w1.to_local().grad().defined());
  });
}

// A share is spent on what the backward needs: an output kept only for recomputing outputs
// that end up kept gives its share back. Here x w1 (read by nothing, needed to recompute
// the add), the add (read by the second product's backward), x' w2 (read by the mul's)
// and the mul (read by the last product's) are 8 KiB each; budget 1 allows the three that
// autograd reads. The greedy order takes x w1, x' w2 and the add first; then x w1 is read
// by nothing recomputed, and its share keeps the mul: nothing is recomputed.
TEST(SelectiveCheckpoint, ABudgetSpendsNothingOnOutputsOnlyKeptOutputsRead) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(3);
    DTensor w1 = hp::randn({32, 32}, mesh, {Replicate()}), w2 = hp::randn({32, 32}, mesh, {Replicate()});
    DTensor w3 = hp::randn({8, 32}, mesh, {Replicate()});
    DTensor s = hp::randn({64, 32}, mesh, {Replicate()}), t = hp::randn({64, 32}, mesh, {Replicate()});
    DTensor x = hp::randn({64, 32}, mesh, {Replicate()});
    for (DTensor* p : {&w1, &w2, &w3, &s, &t, &x}) p->requires_grad_();
    track_cpu_memory();
    const int64_t before = cpu_memory_allocated();
    DTensor out = memory::checkpoint(
        [&](const DTensor& in) { return linear(mul(linear(add(linear(in, w1), s), w2), t), w3); }, x,
        {&w1, &w2, &w3, &s, &t}, budget(1.0));
    const int64_t kept = cpu_memory_allocated() - before - 64 * 8 * 4;  // less the result
    EXPECT_EQ(kept, 3 * 64 * 32 * 4) << "the add, x' w2 and the mul";
    const double recomputed = memory::recompute_seconds();
    out.to_local().sum().backward();
    EXPECT_EQ(memory::recompute_seconds(), recomputed) << "something was recomputed";
    EXPECT_TRUE(w1.to_local().grad().defined());
  });
}

// The budget is the share of the activations of the regions still waiting for their
// backward: a region keeps what the one before it left. Each region here reads two 8 KiB
// outputs in backward (x w1, by the mul's; the mul's, by the last product's); budget 0.75
// allows 12 KiB, one output. The second region gets the first's 4 KiB left over, and keeps
// both. After the backward the next region starts afresh.
TEST(SelectiveCheckpoint, ABudgetLeftUnusedPassesToTheNextRegion) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 4, {32, 32}, {32, 32});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    auto region = [&](const DTensor& in) {
      return memory::checkpoint([&](const DTensor& t) { return linear(mul(linear(t, w1), s), w2); }, in,
                                {&w1, &w2, &s}, budget(0.75));
    };
    const int64_t output = 64 * 32 * 4;
    track_cpu_memory();
    for (int pass = 0; pass < 2; ++pass) {
      const int64_t before = cpu_memory_allocated();
      DTensor first = region(x);
      const int64_t after_first = cpu_memory_allocated();
      DTensor second = region(first);
      const int64_t after_second = cpu_memory_allocated();
      EXPECT_EQ(after_first - before - output, output) << "pass " << pass << ": the first region keeps one";
      EXPECT_EQ(after_second - after_first - output, 2 * output) << "pass " << pass << ": the second keeps both";
      second.to_local().sum().backward();
    }
    EXPECT_TRUE(w1.to_local().grad().defined());
  });
}

// A budget spends on products first; the rest, cheap to recompute, only gets what lies
// beyond the largest product left out. Here the mul's output (8 KiB, read by the first
// product's backward) and the first product's (16 KiB, read by the second's) are what the
// backward reads; 5/12 of them is 10 KiB. The first region keeps neither: its product does
// not fit, and keeping the mul's output would leave too little to pass on. The second,
// with 20 KiB, keeps its product.
TEST(SelectiveCheckpoint, ABudgetKeepsProductsBeforeCheapOutputs) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 6, {64, 32}, {32, 64});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    auto region = [&](const DTensor& in) {
      return memory::checkpoint([&](const DTensor& t) { return linear(linear(mul(t, s), w1), w2); }, in,
                                {&w1, &w2, &s}, budget(5.0 / 12));
    };
    const int64_t output = 64 * 32 * 4;
    track_cpu_memory();
    const int64_t before = cpu_memory_allocated();
    DTensor first = region(x);
    const int64_t after_first = cpu_memory_allocated();
    DTensor second = region(first);
    EXPECT_EQ(after_first - before - output, 0) << "the first region keeps nothing";
    EXPECT_EQ(cpu_memory_allocated() - after_first - output, 2 * output) << "the second keeps its product";
    second.to_local().sum().backward();
    EXPECT_TRUE(w1.to_local().grad().defined());
  });
}

// With a swap tier, the same budget sends the first region's product (16 KiB) to a file
// instead of recomputing it, and keeps the rest as before: one file, nothing more in
// memory, the gradients of the run without checkpointing.
TEST(SelectiveCheckpoint, ABudgetWithATierSwapsTheProductsItLeavesOut) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 6, {64, 32}, {32, 64});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    auto fn = [&](const DTensor& t) { return linear(linear(mul(t, s), w1), w2); };
    auto grads = [&] { return take_grads(t); };
    fn(fn(x)).to_local().sum().backward();
    const std::vector<at::Tensor> want = grads();
    const CheckpointOptions o = budget_swapping(5.0 / 12);
    const std::string dir = std::static_pointer_cast<memory::FileTier>(o.swap_tier)->dir();
    auto region = [&](const DTensor& in) { return memory::checkpoint(fn, in, {&w1, &w2, &s}, o); };
    const int64_t output = 64 * 32 * 4;
    track_cpu_memory();
    const int64_t before = cpu_memory_allocated();
    DTensor first = region(x);
    memory::wait_for_swap_writes();
    const int64_t after_first = cpu_memory_allocated();
    DTensor second = region(first);
    memory::wait_for_swap_writes();
    EXPECT_EQ(after_first - before - output, 0) << "the first region keeps nothing in memory";
    EXPECT_EQ(cpu_memory_allocated() - after_first - output, 2 * output) << "the second keeps its product";
    std::vector<uintmax_t> files;
    for (const auto& f : std::filesystem::directory_iterator(dir)) files.push_back(std::filesystem::file_size(f.path()));
    EXPECT_EQ(files, std::vector<uintmax_t>{64 * 64 * 4}) << "the first region's product alone in a file";
    second.to_local().sum().backward();
    const std::vector<at::Tensor> got = grads();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "gradient " << i;
  });
}

// A kept product that autograd does not read, kept only to recompute the add that reads
// it, gives way to the add's output (8 KiB each): the same memory, and here nothing left
// to recompute.
TEST(SelectiveCheckpoint, KeepsTheReaderInsteadOfAProductOnlyItReads) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 7, {32, 32}, {8, 32});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    track_cpu_memory();
    const int64_t before = cpu_memory_allocated();
    DTensor out = memory::checkpoint([&](const DTensor& in) { return linear(add(linear(in, w1), s), w2); }, x,
                                     {&w1, &w2, &s}, selective());
    EXPECT_EQ(cpu_memory_allocated() - before - 64 * 8 * 4, 64 * 32 * 4) << "one output kept";
    const double recomputed = memory::recompute_seconds();
    out.to_local().sum().backward();
    EXPECT_EQ(memory::recompute_seconds(), recomputed) << "something was recomputed";
    EXPECT_TRUE(w1.to_local().grad().defined());
  });
}

// A recomputed output goes as soon as the node that read it has run, as autograd frees
// what it saved: when the mul's gradient is made, the replayed mul output (8 KiB) is gone,
// and the region holds no more than the same function without checkpointing.
TEST(SelectiveCheckpoint, ARecomputedOutputGoesOnceItsNodeHasRun) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 5, {32, 32}, {32, 32});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    track_cpu_memory();
    int64_t at_mul_grad = 0;
    auto fn = [&](const DTensor& in) {
      DTensor m = mul(linear(in, w1), s);
      if (m.to_local().requires_grad())  // not in the replay
        m.to_local().register_hook([&](const at::Tensor&) { at_mul_grad = cpu_memory_allocated(); });
      return linear(m, w2);
    };
    auto held_at_mul_grad = [&](bool checkpointed) {
      const int64_t before = cpu_memory_allocated();
      DTensor out = checkpointed ? memory::checkpoint(fn, x, {&w1, &w2, &s}, selective()) : fn(x);
      out.to_local().sum().backward();
      return at_mul_grad - before;
    };
    const int64_t plain = held_at_mul_grad(false), checkpointed = held_at_mul_grad(true);
    EXPECT_LE(checkpointed, plain) << "checkpointed " << checkpointed << " B, plain " << plain << " B";
  });
}

// The last saved tensor in a kept output takes it over once the replay has read it: swiglu's
// backward then writes its gradients over the kept gate and up, as it does without
// checkpointing, and the region's backward holds no more than the plain one.
TEST(SelectiveCheckpoint, SwiGLUWritesItsGradientsOverKeptInputs) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 8, {32, 32}, {32, 32});
    track_cpu_memory();
    auto fn = [&](const DTensor& in) { return mul(swiglu(linear(in, t.w1), linear(in, t.w2)), t.s); };
    auto backward_peak = [&](bool checkpointed) {
      const int64_t before = cpu_memory_allocated();
      DTensor out = checkpointed ? memory::checkpoint(fn, t.x, {&t.w1, &t.w2, &t.s}, selective()) : fn(t.x);
      reset_cpu_memory_peak();
      out.to_local().sum().backward();
      return std::pair{cpu_memory_peak() - before, t.x.to_local().grad().clone()};
    };
    const auto [plain, plain_grad] = backward_peak(false);
    t.x.to_local().mutable_grad().zero_();
    const auto [checkpointed, grad] = backward_peak(true);
    EXPECT_TRUE(at::equal(grad, plain_grad));
    EXPECT_LE(checkpointed, plain) << "checkpointed " << checkpointed << " B, plain " << plain << " B";
  });
}

// release_at_next_region: a region lets go of what it drops when the next one starts, so the
// last of three, whose backward comes first, keeps all it made and replays nothing; the
// gradients are bitwise those without checkpointing.
TEST(SelectiveCheckpoint, ReleaseAtNextRegionReplaysOnlyRegionsFollowedByAnother) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 9, {32, 32}, {32, 32});
    track_cpu_memory();
    int calls = 0;
    auto fn = [&](const DTensor& in) {
      ++calls;
      return linear(mul(linear(in, t.w1), t.s), t.w2);
    };
    struct Run {
      int calls;
      int64_t held;
      at::Tensor grad;
    };
    auto run = [&](std::optional<CheckpointOptions> o) {
      calls = 0;
      t.x.to_local().mutable_grad() = at::Tensor();
      const int64_t before = cpu_memory_allocated();
      DTensor h = t.x;
      for (int i = 0; i < 3; ++i) h = o ? memory::checkpoint(fn, h, {&t.w1, &t.w2, &t.s}, *o) : fn(h);
      const int64_t held = cpu_memory_allocated() - before;
      h.to_local().sum().backward();
      return Run{calls, held, t.x.to_local().grad().clone()};
    };
    CheckpointOptions deferred = selective();
    deferred.release_at_next_region = true;
    const Run plain = run(std::nullopt), released = run(selective()), held = run(deferred);
    EXPECT_EQ(released.calls, 6);  // three forwards, three replays
    EXPECT_EQ(held.calls, 5);      // the last region replays nothing
    EXPECT_TRUE(at::equal(held.grad, plain.grad));
    EXPECT_TRUE(at::equal(released.grad, plain.grad));
    // After the forward the first two have let go, the last has not.
    EXPECT_LT(released.held, held.held) << released.held << " B released, " << held.held << " B held";
    EXPECT_LT(held.held, plain.held) << held.held << " B held, " << plain.held << " B plain";
  });
}

TEST(SelectiveCheckpoint, ReleaseAtNextRegionBudgetTp2) {
  CheckpointOptions o = budget(0.4);
  o.release_at_next_region = true;
  expect_same_as_without(Layout::Tp2, kBlocks, o);
}
TEST(SelectiveCheckpoint, ReleaseAtNextRegionFsdp3Uneven) {
  CheckpointOptions o = selective();
  o.release_at_next_region = true;
  expect_same_as_without(Layout::Fsdp3, kBlocks, o);
}
TEST(SelectiveCheckpoint, ReleaseAtNextRegionSwapMatmulsSingleProcess) {
  CheckpointOptions o = swap_matmuls();  // the last block writes nothing to the tier
  o.release_at_next_region = true;
  expect_same_as_without(Layout::Single, kBlocks, o);
}

// Under tensor parallelism a row-parallel product's partial sums feed a reduce-scatter the
// region keeps; nothing else reads them, so the forward lets them go with the model, as a
// run without checkpointing does (before, the region held them until its forward ended).
TEST(SelectiveCheckpoint, PartialSumsGoOnceTheirReduceScatterHasRun) {
  comm::run_local_ranks(2, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    manual_seed(4);
    DTensor w = hp::randn({32, 64}, mesh, {Shard(1)}), x = hp::randn({16, 64}, mesh, {Shard(1)});
    w.requires_grad_();
    x.requires_grad_();
    std::vector<bool> gone;  // per call: whether the partial sums were freed after the reduce-scatter
    auto fn = [&](const DTensor& in) {
      std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> partial;
      std::optional<DTensor> r;
      {
        DTensor p = linear(in, w);
        EXPECT_TRUE(p.placements()[0].is_partial());
        partial = p.to_local().storage().getWeakStorageImpl();
        r = p.redistribute({Shard(0)});
      }
      gone.push_back(partial->expired());
      return mul(*r, *r);
    };
    const at::Tensor want = fn(x).to_local().detach();
    DTensor y = memory::checkpoint(fn, x, {&w}, selective());
    EXPECT_TRUE(at::equal(y.to_local(), want));
    y.to_local().sum().backward();
    ASSERT_GE(gone.size(), 2u);  // plain, then the region's forward
    EXPECT_TRUE(gone[0]);
    EXPECT_TRUE(gone[1]) << "the region held the partial sums past their reduce-scatter";
  });
}

// swap_wrapper: every activation a block's backward reads goes to the tier and comes back;
// bitwise equal to the run without, on files and in host memory, alone, under tp and under
// fully_shard over 3 uneven ranks.
std::shared_ptr<memory::FileTier> swap_files() {
  char tmpl[] = "/tmp/hp_act_swap_XXXXXX";
  HP_CHECK(::mkdtemp(tmpl) != nullptr) << "mkdtemp";
  return std::make_shared<memory::FileTier>(tmpl);
}

TEST(SwapWrapper, FilesSingleProcess) {
  expect_same_as_without(Layout::Single, kBlocks, swap_options(swap_files()));
}
TEST(SwapWrapper, HostMemoryTp2) {
  expect_same_as_without(Layout::Tp2, kBlocks, swap_options(std::make_shared<memory::HostTier>()));
}
TEST(SwapWrapper, HostMemoryFsdp3Uneven) {
  expect_same_as_without(Layout::Fsdp3, kBlocks, swap_options(std::make_shared<memory::HostTier>()));
}

// With files, a forward keeps none of the blocks' op outputs in memory: no more than
// swapping the matmuls and recomputing the rest, less than keeping them. (Tensors a
// backward saves that are no op's output, such as attention's log-sum-exp, stay.)
TEST(SwapWrapper, KeepsNoOpOutputInMemory) {
  const int64_t none = kept_after_forward({});
  const int64_t sel = kept_after_forward(kBlocks, selective());
  const int64_t matmuls = kept_after_forward(kBlocks, swap_matmuls());
  const int64_t swapped = kept_after_forward(kBlocks, swap_options(swap_files()));
  const std::string figures = "none " + std::to_string(none) + ", selective " + std::to_string(sel) +
                              ", swap matmuls " + std::to_string(matmuls) + ", swap all " + std::to_string(swapped);
  EXPECT_LE(swapped, matmuls) << figures;
  EXPECT_LT(swapped, sel) << figures;
}

// Swap files that vanish before the backward, or a disk too full to write them, are errors
// that name the file; neither hangs, and the next step on a sound disk gives the gradients
// of a step without swapping.
TEST(SwapWrapper, AVanishedOrUnwritableSwapFileIsAnError) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 7, {32, 32}, {32, 32});
    DTensor &w1 = t.w1, &w2 = t.w2, &s = t.s, &x = t.x;
    auto fn = [&](const DTensor& in) { return linear(mul(linear(in, w1), s), w2); };
    auto grads = [&] { return take_grads(t); };
    fn(x).to_local().sum().backward();
    const std::vector<at::Tensor> want = grads();
    const std::shared_ptr<memory::FileTier> files = swap_files();
    const CheckpointOptions o = swap_options(files);
    auto error_of = [](auto&& run) {
      try {
        run();
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };

    std::optional<DTensor> out = memory::checkpoint(fn, x, {&w1, &w2, &s}, o);
    memory::wait_for_swap_writes();
    int removed = 0;
    for (const auto& f : std::filesystem::directory_iterator(files->dir())) removed += std::filesystem::remove(f.path());
    EXPECT_GT(removed, 0);
    const std::string vanished = error_of([&] { out->to_local().sum().backward(); });
    EXPECT_NE(vanished.find(files->dir() + "/activation."), std::string::npos) << vanished;
    out.reset();
    grads();

    rlimit old;
    ::getrlimit(RLIMIT_FSIZE, &old);
    auto previous = std::signal(SIGXFSZ, SIG_IGN);
    rlimit tiny = old;
    tiny.rlim_cur = 100;  // smaller than any output of the region
    ::setrlimit(RLIMIT_FSIZE, &tiny);
    // The writes run behind the next region's forward: their error comes out of that
    // region's forward, of the backward, or of wait_for_swap_writes.
    const std::string full_at_wait = error_of([&] {
      DTensor y = memory::checkpoint(fn, x, {&w1, &w2, &s}, o);
      memory::wait_for_swap_writes();
    });
    const std::string full_at_next = error_of([&] {
      DTensor y = memory::checkpoint(fn, x, {&w1, &w2, &s}, o);
      DTensor next = memory::checkpoint(fn, y, {&w1, &w2, &s}, o);
      ADD_FAILURE() << "the next region's forward ended";
    });
    const std::string full_at_backward =
        error_of([&] { memory::checkpoint(fn, x, {&w1, &w2, &s}, o).to_local().sum().backward(); });
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
    for (const std::string& full : {full_at_wait, full_at_next, full_at_backward})
      EXPECT_NE(full.find(files->dir() + "/activation."), std::string::npos) << full;
    grads();

    memory::checkpoint(fn, x, {&w1, &w2, &s}, o).to_local().sum().backward();
    const std::vector<at::Tensor> got = grads();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "gradient " << i;
  });
}

// A tier that counts what goes through it. With `gather`, each read waits until that many
// reads have begun (10 s at most, then `scattered`): they were asked for together.
class CountingTier : public memory::StorageTier {
 public:
  explicit CountingTier(std::shared_ptr<memory::StorageTier> inner, int gather = 0)
      : inner_(std::move(inner)), gather_(gather) {}
  void write(const std::string& key, const at::Tensor& t) override {
    inner_->write(key, t);
    written_bytes += static_cast<int64_t>(t.nbytes());
    std::lock_guard<std::mutex> lock(mu_);
    reads.emplace(key, 0);
  }
  void read(const std::string& key, at::Tensor& into) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++begun_;
      gathered_.notify_all();
      if (!gathered_.wait_for(lock, std::chrono::seconds(10), [&] { return begun_ >= gather_ || scattered; }))
        scattered = true;  // the others go on at once
    }
    inner_->read(key, into);
    std::lock_guard<std::mutex> lock(mu_);
    ++reads[key];
  }
  void remove(const std::string& key) override { inner_->remove(key); }
  std::string describe() const override { return inner_->describe(); }
  std::atomic<int64_t> written_bytes{0};
  std::map<std::string, int> reads;  // per key written, the times it was read
  std::atomic<bool> scattered{false};

 private:
  std::shared_ptr<memory::StorageTier> inner_;
  std::mutex mu_;
  std::condition_variable gathered_;
  int gather_, begun_ = 0;
};

// A swapped region's backward brings its outputs back one at a time, the next ones read
// while autograd works on the last, instead of all at once; the region before follows on.
// So the backward's peak stays well under the bytes swapped; every output is read once;
// the gradients are those of the run without swapping.
TEST(SwapWrapper, BringsBackOneOutputAtATime) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    manual_seed(11);
    std::vector<DTensor> w;
    for (int i = 0; i < 16; ++i) w.push_back(hp::randn({64, 64}, mesh, {Replicate()}));
    DTensor x = hp::randn({1024, 64}, mesh, {Replicate()});
    std::vector<DTensor*> first, second, all{&x};
    for (int i = 0; i < 16; ++i) (i < 8 ? first : second).push_back(&w[i]), all.push_back(&w[i]);
    for (DTensor* p : all) p->requires_grad_();
    auto layers = [](const std::vector<DTensor*>& ws) {
      return [ws](const DTensor& in) {
        DTensor y = in;
        for (DTensor* wi : ws) y = softmax(linear(y, *wi), -1);  // each saves a [1024, 64] output
        return y;
      };
    };
    auto grads = [&] {
      std::vector<at::Tensor> g;
      for (DTensor* p : all) {
        g.push_back(p->to_local().grad().clone());
        p->to_local().mutable_grad().zero_();
      }
      return g;
    };
    layers(second)(layers(first)(x)).to_local().square().sum().backward();
    const std::vector<at::Tensor> want = grads();

    // The backward's peak, and the bytes swapped, with `read_ahead` (0: the default); each
    // read waits for `gather` to have begun.
    auto run = [&](int64_t read_ahead, int gather) {
      auto tier = std::make_shared<CountingTier>(swap_files(), gather);
      CheckpointOptions o = swap_options(tier);
      o.swap_read_ahead = read_ahead;
      track_cpu_memory();
      DTensor y = memory::checkpoint(layers(second), memory::checkpoint(layers(first), x, first, o), second, o);
      at::Tensor loss = y.to_local().square().sum();
      memory::wait_for_swap_writes();
      const int64_t before = cpu_memory_allocated();
      reset_cpu_memory_peak();
      loss.backward();
      const int64_t peak = cpu_memory_peak() - before;
      EXPECT_GE(tier->written_bytes, 14 * 1024 * 64 * 4);  // all but the regions' outputs
      for (const auto& [key, n] : tier->reads) EXPECT_EQ(n, 1) << key;
      const std::vector<at::Tensor> got = grads();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << "gradient " << i;
      EXPECT_FALSE(tier->scattered) << "not all " << gather << " reads were asked for at once";
      return std::pair<int64_t, int64_t>(peak, tier->written_bytes);
    };
    const auto [peak, swapped] = run(0, 0);
    EXPECT_LT(peak, swapped / 2) << "the backward's peak, of " << swapped << " bytes swapped";
    // Reading everything ahead asks for it all when the backward starts.
    run(int64_t{1} << 40, 14);
  });
}

// With the graph retained, a second backward through swapped regions finds what the first
// brought back, and adds the same gradients again.
TEST(SwapWrapper, ASecondBackwardWithTheGraphRetained) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    SmallRegionTensors t = small_region_tensors(mesh, 5, {32, 32}, {32, 32});
    auto fn = [&](const DTensor& in) { return linear(mul(linear(in, t.w1), t.s), t.w2); };
    auto tier = std::make_shared<CountingTier>(swap_files());
    const CheckpointOptions o = swap_options(tier);
    DTensor y = memory::checkpoint(fn, memory::checkpoint(fn, t.x, {&t.w1, &t.w2, &t.s}, o), {&t.w1, &t.w2, &t.s}, o);
    y.to_local().sum().backward({}, /*retain_graph=*/true);
    const std::vector<at::Tensor> once = take_grads(t);
    y.to_local().sum().backward();
    const std::vector<at::Tensor> again = take_grads(t);
    for (size_t i = 0; i < once.size(); ++i) EXPECT_TRUE(at::equal(again[i], once[i])) << "gradient " << i;
    EXPECT_FALSE(tier->reads.empty());
    for (const auto& [key, n] : tier->reads) EXPECT_EQ(n, 1) << key;
  });
}

TEST(SwapWrapper, HostTierRoundTripsAndNamesBadReads) {
  memory::HostTier tier;
  at::Tensor a = at::arange(12, at::kFloat).view({3, 4}).t();  // not contiguous: stored as its values
  tier.write("a", a);
  EXPECT_EQ(tier.resident_bytes(), 48);
  at::Tensor back = at::empty({4, 3});
  tier.read("a", back);
  EXPECT_TRUE(at::equal(back, a));
  at::Tensor wrong = at::empty({5});
  EXPECT_THROW(tier.read("a", wrong), hp::Error);
  EXPECT_THROW(tier.read("b", back), hp::Error);
  tier.remove("a");
  EXPECT_EQ(tier.resident_bytes(), 0);
  EXPECT_THROW(tier.read("a", back), hp::Error);
}

// The default policy keeps collective outputs: a step issues the same collectives as
// without checkpointing, where full checkpointing issues the recomputed ones again.
TEST(SelectiveCheckpoint, CollectivesAreNotIssuedTwice) {
  auto collectives = [](std::vector<std::string> checkpointed, CheckpointOptions o) {
    hp::testing::LlamaRunSpec spec = hp::testing::checkpointed_llama(Layout::Tp2, checkpointed, o);
    spec.steps = 1;
    std::atomic<size_t> n{0};
    auto inner = spec.parallelize;
    spec.parallelize = [inner](nn::Llama& m, const DeviceMesh& mesh) {
      comm::current_world()->collective_log().clear();
      comm::current_world()->collective_log().enable();
      return inner(m, mesh);
    };
    spec.after_backward = [&n](nn::Llama&, int64_t) {
      auto& log = comm::current_world()->collective_log();
      n = log.records().size();  // rank 0 and 1 issue the same list
      log.enable(false);
    };
    hp::testing::train_llama(spec);
    return n.load();
  };
  const size_t none = collectives({}, {}), sel = collectives(kBlocks, selective()), full = collectives(kBlocks, {});
  EXPECT_EQ(sel, none);
  EXPECT_GT(full, none);
}

TEST(SelectiveCheckpoint, ImpossibleBudgetAndSwapAreErrors) {
  CheckpointOptions o = policy(CheckpointPolicy::MUST_SAVE);
  o.memory_budget = 0.1;
  try {
    kept_after_forward(kBlocks, o);
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("memory budget 0.1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kept_after_forward(kBlocks, budget(1.5)), hp::Error);
  EXPECT_THROW(kept_after_forward(kBlocks, policy(CheckpointPolicy::MUST_SWAP)), hp::Error);
  CheckpointOptions behind = swap_options(swap_files());
  behind.swap_read_ahead = -1;
  EXPECT_THROW(kept_after_forward(kBlocks, behind), hp::Error);
  CheckpointOptions full;  // a full region has nothing to release later
  full.release_at_next_region = true;
  EXPECT_THROW(kept_after_forward(kBlocks, full), hp::Error);
}
