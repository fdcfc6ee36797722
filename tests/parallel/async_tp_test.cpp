// Sequence-parallel Llama with async_tp (all-gather + matmul and matmul + reduce-scatter
// decomposed into per-rank pieces) against the same training with the collectives whole:
// losses every step, every gradient of the first step, every parameter after 5 steps, on
// every rank (train_llama checks that ranks agree bitwise). Tolerance 0: the pieces are
// the same rows of the same products and the sums run in the same order. Two exceptions,
// checked at rtol 1e-6 (absolute floor 1e-6): for very small products (the tiny model's
// row-parallel inputs 5 and 6 features wide at tp 3; pieces of one position) this BLAS
// picks a kernel by row count that rounds differently, so a block of rows differs from the
// same rows of the whole product in the last bit. The synchronous path is checked against the
// single-process reference by tp_test.cpp.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/comm/collective_log.h"
#include "hp/comm/collectives.h"
#include "parallel/llama_run.h"

using namespace hp;
using hp::testing::LlamaRun;
using hp::testing::LlamaRunSpec;

namespace {

enum class Wrap { None, DDP, FSDP };

struct Config {
  const char* name;
  int64_t dp, tp;
  Wrap wrap = Wrap::None;
  bool tied = false;
  double rtol = 0;  // 0: bitwise
  bool wide = false;  // 6 heads of 4 over 24 dims: 8 features per rank at tp 3
  int64_t seq = 8;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

// `sends`: point-to-point sends this rank issued in the first step (the pieces).
LlamaRunSpec spec_of(const Config& c, bool async_tp, std::vector<int64_t>* sends = nullptr) {
  LlamaRunSpec spec;
  spec.mesh_shape = {c.dp, c.tp};
  spec.mesh_names = {"dp", "tp"};
  spec.tied = c.tied;
  spec.seq = c.seq;
  if (c.wide) spec.configure = [](nn::LlamaConfig& m) { m.dim = 24, m.heads = 6, m.kv_heads = 3; };
  const Wrap wrap = c.wrap;
  spec.parallelize = [wrap, async_tp](nn::Llama& model, const DeviceMesh& mesh) {
    LlamaParallelOptions o;
    o.sequence_parallel = true;
    o.async_tp = async_tp;
    parallelize_llama(model, mesh["tp"], o);
    comm::CollectiveLog& log = comm::current_world()->collective_log();
    log.clear();
    log.enable(true);
    if (wrap == Wrap::DDP) {
      auto ddp = std::make_shared<DistributedDataParallel>(model, mesh["dp"]);
      return std::function<void(bool)>([ddp](bool on) { ddp->set_requires_gradient_sync(on); });
    }
    if (wrap == Wrap::FSDP) {
      FSDPModule root = fully_shard_llama(model, mesh["dp"]);
      return std::function<void(bool)>([root](bool on) mutable { root.set_requires_gradient_sync(on); });
    }
    return std::function<void(bool)>();
  };
  spec.after_backward = [sends](nn::Llama&, int64_t step) {
    comm::CollectiveLog& log = comm::current_world()->collective_log();
    if (step != 0 || !log.enabled()) return;
    int64_t n = 0;
    for (const auto& r : log.records()) n += r.op == "send";
    log.enable(false);
    if (sends && comm::current_world()->rank() == 0) sends->push_back(n);
  };
  return spec;
}

void expect_bitwise(const LlamaRun& a, const LlamaRun& b) {
  EXPECT_EQ(a.losses, b.losses);
  for (auto which : {&LlamaRun::first_grads, &LlamaRun::final_params})
    for (auto& [name, t] : b.*which) EXPECT_TRUE(at::equal((a.*which).at(name), t)) << name;
}

class AsyncTP : public ::testing::TestWithParam<Config> {};

}  // namespace

TEST_P(AsyncTP, BitwiseEqualToWholeCollectives) {
  std::vector<int64_t> sends_off, sends_on;
  const LlamaRun whole = hp::testing::train_llama(spec_of(GetParam(), false, &sends_off));
  const LlamaRun pieces = hp::testing::train_llama(spec_of(GetParam(), true, &sends_on));
  if (GetParam().rtol == 0) expect_bitwise(pieces, whole);
  else hp::testing::expect_runs_match(pieces, whole, GetParam().rtol, 1e-6);
  EXPECT_LT(whole.losses.back(), whole.losses.front());
  // The decomposition ran (or the comparison would prove nothing), each input gathered
  // once: per block and peer, one piece out for the input of q, k, v, one for gate, up and
  // one for each of o and down, forward, and one for each of o and down backward; one more
  // for the head's input.
  // Rows go only to peers whose piece is not empty (rank 0's never is).
  const int64_t layers = hp::testing::tiny_llama().layers, peers = GetParam().tp - 1;
  const auto seq_pieces = comm::chunk_sizes(GetParam().seq, static_cast<int>(GetParam().tp));
  const int64_t with_rows = std::count_if(seq_pieces.begin() + 1, seq_pieces.end(), [](int64_t n) { return n > 0; });
  EXPECT_EQ(sends_off, std::vector<int64_t>{0});
  EXPECT_EQ(sends_on, std::vector<int64_t>{peers * (4 * layers + (GetParam().tied ? 0 : 1)) + with_rows * 2 * layers});
}

INSTANTIATE_TEST_SUITE_P(Layouts, AsyncTP,
                         ::testing::Values(Config{"tp2", 1, 2},                         //
                                           Config{"tp3_uneven_seq", 1, 3, Wrap::None, false, 1e-6},  //
                                           Config{"tp3_uneven_seq_wide", 1, 3, Wrap::None, false, 0, true},  //
                                           Config{"tp4", 1, 4},                         //
                                           Config{"tp4_seq3_one_rank_empty", 1, 4, Wrap::None, false, 1e-6, false,
                                                  3},  //
                                           Config{"dp2_x_tp2", 2, 2},                   //
                                           Config{"ddp2_x_tp2", 2, 2, Wrap::DDP},       //
                                           Config{"fsdp2_x_tp2", 2, 2, Wrap::FSDP},     //
                                           Config{"tp2_tied", 1, 2, Wrap::None, true}),  //
                         [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });

// What the bitwise equality rests on: rows of a product computed apart are the rows of the
// whole product (this BLAS keeps each row's reduction order whatever the row count).
TEST(AsyncTPPieces, RowBlocksOfAProductEqualTheWholeProduct) {
  at::manual_seed(7);
  const at::Tensor x = at::randn({3, 11, 40}), w = at::randn({24, 40});
  const at::Tensor whole = at::linear(x, w);
  int64_t offset = 0;
  for (int64_t n : {4, 4, 3}) {
    EXPECT_TRUE(at::equal(at::linear(x.narrow(1, offset, n).contiguous(), w), whole.narrow(1, offset, n)));
    offset += n;
  }
}

TEST(AsyncTPErrors, NeedsSequenceParallelAndLinears) {
  comm::run_local_ranks(2, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    nn::Llama model(hp::testing::tiny_llama(), mesh);
    LlamaParallelOptions o;
    o.async_tp = true;  // without sequence_parallel
    try {
      parallelize_llama(model, mesh, o);
      ADD_FAILURE() << "async_tp without sequence_parallel was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("set sequence_parallel too"), std::string::npos) << e.what();
    }
    try {
      parallelize_module(model, mesh, {{"tok_embeddings", ColwiseParallel(Replicate(), Shard(-1), true)}});
      ADD_FAILURE() << "async_tp on an Embedding was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("not Embedding"), std::string::npos) << e.what();
    }
    try {
      parallelize_module(model, mesh, {{"layers.0.attn.o_proj", RowwiseParallel(std::nullopt, Replicate(), true)}});
      ADD_FAILURE() << "async_tp on a Rowwise Linear with a Replicate output was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("must be Shard(1)"), std::string::npos) << e.what();
    }
  });
}

// FP8 applied after async_tp replaces the products of the Linears it takes: those take
// their input whole again (the plain FP8 path), the others (the head, kept float32) keep
// their pieces.
TEST(AsyncTPWithFP8, LaterFP8ProductsReplaceTheAsyncOnes) {
  auto with_fp8 = [](LlamaRunSpec spec) {
    auto inner = spec.parallelize;
    spec.parallelize = [inner](nn::Llama& model, const DeviceMesh& mesh) {
      auto set_sync = inner(model, mesh);
      apply_low_precision(model, LowPrecisionConfig{});
      return set_sync;
    };
    return spec;
  };
  const Config tp2{"tp2", 1, 2};
  std::vector<int64_t> sends_off, sends_on;
  const LlamaRun whole = hp::testing::train_llama(with_fp8(spec_of(tp2, false, &sends_off)));
  const LlamaRun pieces = hp::testing::train_llama(with_fp8(spec_of(tp2, true, &sends_on)));
  expect_bitwise(pieces, whole);
  EXPECT_EQ(sends_off, std::vector<int64_t>{0});
  EXPECT_EQ(sends_on, std::vector<int64_t>{1});  // the head's input
}
