// Activation checkpointing inside pipeline stages: each stage's blocks run as one
// checkpointed region (hp::checkpoint on plain tensors), against the same pipeline without
// it on the same numbers: the loss of 5 steps of SGD, every gradient of every step and
// every parameter after the last, on every rank, bitwise (the recompute repeats the same
// kernels). Schedules: GPipe and 1F1B on 2 and 4 ranks, interleaved 1F1B (two stages per
// rank); a schedule with split backwards is refused with an error that says so.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <mutex>

#include "hp/comm.h"
#include "hp/memory.h"
#include "hp/pipeline.h"
#include "hp/schedule.h"
#include "pipeline/mlp.h"

using namespace hp;

namespace {

constexpr int kBlocks = 8, kDim = 8, kBatch = 24, kSteps = 5;

at::Tensor data(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::kDouble);
}

void checkpoint_stages(std::vector<pipeline::PipelineStage>& stages) {
  for (auto& st : stages) {
    auto p = std::make_shared<std::vector<at::Tensor>>(st.parameters);
    st.forward = [p](const at::Tensor& x) {
      std::vector<at::Tensor*> slots;
      for (at::Tensor& t : *p) slots.push_back(&t);
      return memory::checkpoint([p](const at::Tensor& in) { return run_blocks(*p, in); }, x, slots);
    };
  }
}

// Per rank: the losses, then every gradient of every step and the final parameters.
std::vector<std::vector<at::Tensor>> run(const std::string& kind, int ranks, int micro, bool checkpointed) {
  Mlp model(kBlocks, kDim, 11);
  std::vector<std::vector<at::Tensor>> seen(ranks);
  std::mutex mu;
  comm::run_local_ranks(ranks, [&](int rank) {
    auto sched = schedule::make_schedule(kind, ranks, micro);
    auto stages = mlp_stages(model, sched, rank, comm::current_world()->world_group());
    if (checkpointed) checkpoint_stages(stages);
    pipeline::PipelineRuntime rt(stages, sched);
    std::vector<at::Tensor> mine;
    for (int step = 0; step < kSteps; ++step) {
      at::Tensor loss = rt.step(data({kBatch, kDim}, 100 + step), data({kBatch, kDim}, 200 + step));
      mine.push_back(loss.detach().clone());
      for (const auto& st : rt.stages())
        for (const at::Tensor& p : st.parameters) {
          mine.push_back(p.grad().clone());
          at::NoGradGuard no_grad;
          p.sub_(p.grad() * 0.1);
        }
      for (const auto& st : rt.stages()) pipeline::zero_grad(st);
    }
    for (const auto& st : rt.stages())
      for (const at::Tensor& p : st.parameters) mine.push_back(p.detach().clone());
    std::lock_guard<std::mutex> lock(mu);
    seen[rank] = mine;
  });
  return seen;
}

void expect_same_as_without(const std::string& kind, int ranks, int micro) {
  auto ref = run(kind, ranks, micro, false), got = run(kind, ranks, micro, true);
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(got[r].size(), ref[r].size()) << "rank " << r;
    for (size_t i = 0; i < ref[r].size(); ++i)
      EXPECT_TRUE(at::equal(got[r][i], ref[r][i])) << kind << " rank " << r << " value " << i;
  }
}

}  // namespace

TEST(CheckpointPipeline, Gpipe2) { expect_same_as_without("gpipe", 2, 4); }
TEST(CheckpointPipeline, OneFOneB4) { expect_same_as_without("1f1b", 4, 6); }
TEST(CheckpointPipeline, Interleaved2) { expect_same_as_without("interleaved-1f1b", 2, 4); }

TEST(CheckpointPipeline, SplitBackwardIsRefused) {
  Mlp model(kBlocks, kDim, 11);
  comm::run_local_ranks(1, [&](int rank) {  // one rank: nobody waits on the failed one
    auto sched = schedule::make_schedule("zb-h1", 1, 2);
    auto stages = mlp_stages(model, sched, rank, comm::current_world()->world_group());
    checkpoint_stages(stages);
    pipeline::PipelineRuntime rt(stages, sched);
    try {
      rt.step(data({kBatch, kDim}, 1), data({kBatch, kDim}, 2));
      ADD_FAILURE() << "expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("split backward"), std::string::npos) << e.what();
    }
  });
}
