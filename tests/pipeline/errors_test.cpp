// A runtime that does not fit its schedule, or a step that does not fit the
// runtime, fails at once with a message that says what and where.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/pipeline.h"
#include "hp/schedule.h"
#include "mlp.h"

using namespace hp;

namespace {

template <typename Fn>
void expect_error(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const hp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PipelineErrors, RuntimeRejectsWhatDoesNotFit) {
  Mlp model(8, 4, 3);
  comm::run_local_ranks(2, [&](int rank) {
    auto group = comm::current_world()->world_group();
    auto s4 = schedule::make_schedule("1f1b", 4, 2);
    expect_error([&] { pipeline::PipelineRuntime(mlp_stages(model, s4, rank, group), s4); },
                 "is for 4 ranks");

    auto s = schedule::make_schedule("1f1b", 2, 2);
    // Stages cut for 4 stages, schedule with 2.
    expect_error([&] { pipeline::PipelineRuntime({mlp_stage(model, rank, 4, group)}, s); },
                 "says 4 stages but schedule '1f1b' has 2");
    // The other rank's stage.
    expect_error([&] { pipeline::PipelineRuntime({mlp_stage(model, 1 - rank, 2, group)}, s); },
                 "puts stages [" + std::to_string(rank) + "] on it");
    // No loss on the last stage.
    auto last = mlp_stage(model, 1, 2, group);
    last.loss = nullptr;
    expect_error([&] { last.check(); }, "needs a loss function");
    expect_error([&] { pipeline::PipelineRuntime({}, s); }, "no stages given");

    // Steps that do not fit the schedule's 2 microbatches (checked before any comm).
    pipeline::PipelineRuntime rt(mlp_stages(model, s, rank, group), s);
    at::Tensor x = at::zeros({3, 4}, at::kDouble);
    expect_error([&] { rt.step(x, x); }, "does not split into 2 equal microbatches");
    expect_error([&] { rt.step(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{x}); },
                 "microbatches, schedule has 2");
  });
}

// An error inside a step names the rank, the action, the stage and the microbatch.
TEST(PipelineErrors, FailureInsideStepSaysWhere) {
  Mlp model(2, 4, 3);
  comm::run_local_ranks(1, [&](int rank) {
    auto s = schedule::make_schedule("gpipe", 1, 2);
    auto st = mlp_stage(model, 0, 1, comm::current_world()->world_group());
    st.forward = [](const at::Tensor& x) -> at::Tensor {
      if (x.size(0) == 1) throw hp::Error("boom");  // the second microbatch is smaller
      return x;
    };
    pipeline::PipelineRuntime rt({st}, s);
    at::Tensor x = at::zeros({4, 4}, at::kDouble);
    std::vector<at::Tensor> xs{x.narrow(0, 0, 3), x.narrow(0, 3, 1)};
    expect_error([&] { rt.step(xs, xs); }, "pipeline rank 0, action #1 F0.1 (stage 0, microbatch 1): boom");
  });
}

}  // namespace
