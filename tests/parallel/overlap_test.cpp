// DDP and fully_shard with their collectives on the progress engine (overlapped with
// backward and forward) against the same training with every collective run on the
// calling thread (HP_ASYNC_COLLECTIVES=0): losses every step, every gradient of the first
// step, every parameter after 5 steps, on every rank (train_llama checks that ranks agree
// bitwise). Tolerance 0: overlap changes when data moves, never the reduction order. The
// single-process reference (rtol 1e-5) is checked by ddp_test.cpp and fsdp_test.cpp on
// the same layouts. Each configuration is one line.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "comm/scoped_env.h"
#include "parallel/llama_run.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

enum class Kind { DDP, FSDP, HSDP };

struct Config {
  const char* name;
  Kind kind;
  std::vector<int64_t> shape;
  std::vector<std::string> names;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

LlamaRunSpec spec_of(const Config& c) {
  LlamaRunSpec spec;
  spec.mesh_shape = c.shape;
  spec.mesh_names = c.names;
  if (c.shape == std::vector<int64_t>{3}) spec.batch = 3;  // 3 ranks: one row each
  const Kind kind = c.kind;
  const auto names = c.names;
  spec.parallelize = [kind, names](nn::Llama& model, const DeviceMesh& mesh) {
    if (names.back() == "tp") parallelize_llama(model, mesh["tp"], {/*sequence_parallel=*/true, true});
    if (kind == Kind::DDP) {
      DDPOptions o;
      o.bucket_cap_mb = 0.002;  // several buckets in flight during backward
      auto ddp = std::make_shared<DistributedDataParallel>(model, mesh["dp"], o);
      return std::function<void(bool)>([ddp](bool on) { ddp->set_requires_gradient_sync(on); });
    }
    FSDPModule root = fully_shard_llama(model, kind == Kind::HSDP ? mesh[{"dp_rep", "dp_shard"}] : mesh["dp"]);
    return std::function<void(bool)>([root](bool on) mutable { root.set_requires_gradient_sync(on); });
  };
  return spec;
}

void expect_bitwise(const LlamaRun& a, const LlamaRun& b) {
  EXPECT_EQ(a.losses, b.losses);
  for (auto which : {&LlamaRun::first_grads, &LlamaRun::final_params})
    for (auto& [name, t] : b.*which) EXPECT_TRUE(at::equal((a.*which).at(name), t)) << name;
}

class Overlap : public ::testing::TestWithParam<Config> {};

}  // namespace

TEST_P(Overlap, BitwiseEqualToCollectivesOnTheCallingThread) {
  const LlamaRunSpec spec = spec_of(GetParam());
  LlamaRun calling_thread;
  {
    ScopedEnv off("HP_ASYNC_COLLECTIVES", "0");
    calling_thread = hp::testing::train_llama(spec);
  }
  expect_bitwise(hp::testing::train_llama(spec), calling_thread);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Overlap,
    ::testing::Values(Config{"ddp4", Kind::DDP, {4}, {"dp"}},                          //
                      Config{"ddp3_uneven", Kind::DDP, {3}, {"dp"}},                   //
                      Config{"ddp2_x_tp2_sp", Kind::DDP, {2, 2}, {"dp", "tp"}},        //
                      Config{"fsdp4", Kind::FSDP, {4}, {"dp"}},                        //
                      Config{"fsdp3_uneven", Kind::FSDP, {3}, {"dp"}},                 //
                      Config{"hsdp2x2", Kind::HSDP, {2, 2}, {"dp_rep", "dp_shard"}},   //
                      Config{"fsdp2_x_tp2", Kind::FSDP, {2, 2}, {"dp", "tp"}}),        //
    [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });
