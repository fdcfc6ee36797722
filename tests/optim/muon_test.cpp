// Muon's pieces: the Newton-Schulz iteration, owners that balance the work, the split
// between Muon and AdamW, and the errors. Distributed Muon against the single-process one
// is in tests/parallel (fully_shard, DistributedDataParallel).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/comm/collectives.h"
#include "hp/comm/local_ranks.h"
#include "hp/nn/transformer.h"
#include "hp/optim/chained.h"
#include "hp/tensor/memory_stats.h"
#include "hp/tensor/random.h"

using namespace hp;

namespace {
nn::LlamaConfig tiny(int64_t layers) {
  nn::LlamaConfig c;
  c.vocab = 32, c.dim = 16, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 24, c.max_seq = 8;
  return c;
}
}  // namespace

TEST(Muon, NewtonSchulzMakesTheMatrixNearlyOrthogonal) {
  at::manual_seed(0);
  for (auto shape : {std::vector<int64_t>{16, 16}, {8, 32}, {48, 12}}) {
    at::Tensor g = at::randn(shape, at::kFloat);
    at::Tensor x = optim::newton_schulz(g, 5);
    ASSERT_EQ(x.sizes(), g.sizes());
    // The quintic iteration trades exactness for speed: singular values land near 1.
    at::Tensor sv = std::get<1>(at::linalg_svd(x, false));
    EXPECT_GT(sv.min().item<double>(), 0.5) << shape[0] << "x" << shape[1];
    EXPECT_LT(sv.max().item<double>(), 1.3) << shape[0] << "x" << shape[1];
    // It keeps the singular vectors of g: x is close to U V^T of g.
    auto [u, s, vh] = at::linalg_svd(g, false);
    at::Tensor polar = at::matmul(u, vh);
    EXPECT_GT((x * polar).sum().item<double>() / (polar * polar).sum().item<double>(), 0.8);
  }
}

TEST(Muon, OwnersBalanceTheWork) {
  comm::run_local_ranks(4, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {4}, {"dp"});
    nn::Llama model(tiny(4), mesh);
    optim::ChainedOptimizer opt = optim::get_hyper_optimizer(model);
    auto& muon = dynamic_cast<optim::Muon&>(opt.part(0));
    std::vector<double> load(4, 0);
    double total = 0;
    auto params = muon.params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& s = params[i]->sizes();
      const double cost = double(s[0]) * double(s[1]) * double(std::min(s[0], s[1]));
      ASSERT_GE(muon.owner(i), 0) << "28 matrices balance whole on 4 ranks: nothing to split";
      load[muon.owner(i)] += cost;
      total += cost;
    }
    // 28 matrices of 4 kinds on 4 ranks: greedy balancing leaves every rank near a quarter.
    for (double l : load) EXPECT_NEAR(l, total / 4, total * 0.05);
  });
}

// The block-split iteration on 3 ranks, each holding a block of columns of the wide form
// (uneven, one rank's block empty for the narrowest), equals the whole iteration.
TEST(Muon, NewtonSchulzOnBlocksEqualsTheWholeIteration) {
  const std::vector<std::vector<int64_t>> shapes{{12, 40}, {8, 9}, {6, 2}};
  std::vector<at::Tensor> full, want;
  at::manual_seed(3);
  for (const auto& s : shapes) {
    full.push_back(at::randn(s, at::kFloat));
    want.push_back(optim::newton_schulz(full.back(), 5));
  }
  comm::run_local_ranks(3, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {3}, {"dp"});
    std::vector<at::Tensor> blocks;
    std::vector<int64_t> starts;
    for (const at::Tensor& f : full) {
      const int64_t cols = f.size(1), width = cols / 3 + (rank < cols % 3 ? 1 : 0);
      const int64_t start = rank * (cols / 3) + std::min<int64_t>(rank, cols % 3);
      starts.push_back(start);
      blocks.push_back(f.narrow(1, start, width));
    }
    std::vector<at::Tensor> got = optim::newton_schulz_blocks(blocks, 5, mesh.group(0));
    for (size_t i = 0; i < full.size(); ++i) {
      at::Tensor expect = want[i].narrow(1, starts[i], got[i].size(1));
      EXPECT_TRUE(at::allclose(got[i], expect, 1e-5, 1e-6))
          << "matrix " << i << " on rank " << rank << ": max diff " << (got[i] - expect).abs().max().item<double>();
    }
  });
}

// Balanced splitting on 4 ranks, matrices sharded by rows: a wide 8 x 4096 matrix costs
// each rank a quarter of its Gram work when split (4.6x less than whole, the 8^3 square
// being small), two 32 x 32 ones would cost each rank half their whole cost (the square
// is repeated on every rank): the wide one is split, the square ones stay whole. After two
// steps every rank's parameters equal the single-process Muon's, for each split choice;
// with the iteration in bfloat16 too, to bfloat16's rounding of the split Gram matrices.
TEST(Muon, LargeMatricesAreSplitOverTheRanks) {
  const std::vector<std::vector<int64_t>> shapes{{8, 4096}, {32, 32}, {32, 32}};
  std::vector<at::Tensor> initial(shapes.size());
  auto train = [&](int ranks, optim::MuonSplit how, std::vector<int>* owners, at::ScalarType ns = at::kFloat) {
    std::vector<at::Tensor> out(shapes.size());
    comm::run_local_ranks(ranks, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {ranks}, {"dp"});
      manual_seed(11);
      std::vector<DTensor> w;
      for (const auto& s : shapes) w.push_back(randn(s, mesh, {Shard(0)}));
      for (size_t i = 0; i < w.size(); ++i) {
        at::Tensor full = w[i].full_tensor();  // every rank takes part
        if (rank == 0) initial[i] = full;
      }
      std::vector<DTensor*> params;
      for (DTensor& x : w) params.push_back(&x);
      optim::MuonOptions o;
      o.split = how, o.ns_dtype = ns;
      optim::Muon muon(params, o);
      for (int step = 0; step < 2; ++step) {
        for (size_t i = 0; i < w.size(); ++i)
          w[i].to_local().mutable_grad() = randn(shapes[i], mesh, {Shard(0)}).to_local();
        muon.step();
      }
      for (size_t i = 0; i < w.size(); ++i) {
        at::Tensor full = w[i].full_tensor();  // every rank takes part
        if (rank != 0) continue;
        out[i] = full;
        if (owners) owners->push_back(muon.owner(i));
      }
    });
    return out;
  };
  const std::vector<at::Tensor> want = train(1, optim::MuonSplit::None, nullptr);
  for (auto [how, expected] : {std::pair<optim::MuonSplit, std::vector<int>>{optim::MuonSplit::Balanced, {-1, 0, 1}},
                               {optim::MuonSplit::None, {0, 1, 2}},
                               {optim::MuonSplit::All, {-1, -1, -1}}}) {
    std::vector<int> owners;
    const std::vector<at::Tensor> got = train(4, how, &owners);
    EXPECT_EQ(owners, expected) << "split choice " << int(how);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-6))
          << "matrix " << i << ", split choice " << int(how) << ": max diff " << (got[i] - want[i]).abs().max().item<double>();
  }
  // In bfloat16 each update is about 1% (Frobenius) from float32's; split Gram matrices
  // round differently again, by as much; whole owners compute what one rank does.
  const std::vector<at::Tensor> want16 = train(1, optim::MuonSplit::None, nullptr, at::kBFloat16);
  auto update_error = [&](const at::Tensor& got, const at::Tensor& want, size_t i) {
    return ((got - want).norm() / (want - initial[i]).norm()).item<double>();
  };
  for (size_t i = 0; i < want16.size(); ++i) {
    EXPECT_GT(update_error(want16[i], want[i], i), 1e-3) << "matrix " << i << ": the iteration ran in float32";
    EXPECT_LT(update_error(want16[i], want[i], i), 0.03) << "matrix " << i;
  }
  for (optim::MuonSplit how : {optim::MuonSplit::Balanced, optim::MuonSplit::None, optim::MuonSplit::All}) {
    const std::vector<at::Tensor> got = train(4, how, nullptr, at::kBFloat16);
    for (size_t i = 0; i < want16.size(); ++i) {
      if (how == optim::MuonSplit::None) EXPECT_TRUE(at::equal(got[i], want16[i])) << "matrix " << i;
      EXPECT_GT(update_error(got[i], want[i], i), 1e-3) << "matrix " << i << ", split choice " << int(how)
                                                        << ": the iteration ran in float32";
      EXPECT_LT(update_error(got[i], want16[i], i), 0.03) << "matrix " << i << ", split choice " << int(how);
    }
  }
}

// Overlapped exchanges (rounds of each owner's k-th matrix, results sent back while the
// next round is computed) against one exchange each way around all the work, on 3 ranks
// with rows, columns (uneven) and replicated placements, whole owners with up to three
// matrices each and, under Balanced, a wide matrix split over the ranks: after two steps
// every rank's parameters are bitwise equal between the two and equal to the
// single-process Muon (rtol 1e-5, atol 1e-6); the collective log shows one all-to-all
// each way per round with overlap and one each way without.
TEST(Muon, OverlappedRoundsEqualOneExchange) {
  const std::vector<std::vector<int64_t>> shapes{{8, 2048}, {40, 24}, {24, 40}, {16, 16}, {30, 8}, {12, 12}, {7, 9}};
  const std::vector<Placement> placements{Shard(0), Shard(1), Shard(0), Replicate(), Shard(1), Shard(0), Shard(0)};
  struct Run {
    std::vector<std::vector<at::Tensor>> local;  // [rank][matrix] after the steps
    std::vector<at::Tensor> full;
    int64_t all_to_alls = 0, rounds = 0;  // per step, on rank 0
  };
  auto train = [&](int ranks, optim::MuonSplit how, bool overlap) {
    Run run;
    run.local.resize(ranks);
    run.full.resize(shapes.size());
    comm::run_local_ranks(ranks, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {ranks}, {"dp"});
      manual_seed(13);
      std::vector<DTensor> w;
      for (size_t i = 0; i < shapes.size(); ++i) w.push_back(randn(shapes[i], mesh, {placements[i]}));
      std::vector<DTensor*> params;
      for (DTensor& x : w) params.push_back(&x);
      optim::MuonOptions o;
      o.split = how;
      o.overlap = overlap;
      optim::Muon muon(params, o);
      auto& log = comm::current_world()->collective_log();
      for (int step = 0; step < 2; ++step) {
        for (size_t i = 0; i < w.size(); ++i)
          w[i].to_local().mutable_grad() = randn(shapes[i], mesh, {placements[i]}).to_local();
        if (step == 1 && rank == 0) log.clear(), log.enable();
        comm::barrier(mesh.group(0));
        muon.step();
        comm::barrier(mesh.group(0));
        if (step == 1 && rank == 0) log.enable(false);
      }
      std::vector<int> owned(ranks, 0);
      for (size_t i = 0; i < w.size(); ++i) {
        run.local[rank].push_back(w[i].to_local().clone());
        if (muon.owner(i) >= 0) ++owned[muon.owner(i)];
      }
      for (size_t i = 0; i < w.size(); ++i) {
        at::Tensor full = w[i].full_tensor();  // every rank takes part
        if (rank == 0) run.full[i] = full;
      }
      if (rank != 0) return;
      run.rounds = std::max(1, *std::max_element(owned.begin(), owned.end()));
      for (const auto& r : log.records()) run.all_to_alls += r.op == "all_to_all";
    });
    return run;
  };
  const Run want = train(1, optim::MuonSplit::None, false);
  for (optim::MuonSplit how : {optim::MuonSplit::None, optim::MuonSplit::Balanced}) {
    const Run one = train(3, how, false), over = train(3, how, true);
    EXPECT_EQ(one.all_to_alls, 2) << "split choice " << int(how);
    EXPECT_GE(over.rounds, 2) << "split choice " << int(how) << ": the matrices should need several rounds";
    EXPECT_EQ(over.all_to_alls, 2 * over.rounds) << "split choice " << int(how);
    for (int r = 0; r < 3; ++r)
      for (size_t i = 0; i < shapes.size(); ++i)
        EXPECT_TRUE(at::equal(over.local[r][i], one.local[r][i]))
            << "matrix " << i << " on rank " << r << ", split choice " << int(how) << ": max diff "
            << (over.local[r][i] - one.local[r][i]).abs().max().item<double>();
    for (size_t i = 0; i < shapes.size(); ++i)
      EXPECT_TRUE(at::allclose(over.full[i], want.full[i], 1e-5, 1e-6))
          << "matrix " << i << ", split choice " << int(how) << ": max diff "
          << (over.full[i] - want.full[i]).abs().max().item<double>();
  }
}

// The step's working memory is a few matrices' worth, not copies of all of them: one rank
// walks the matrices one by one; ranks that exchange pieces hold the send and receive
// buffers of the exchange, and each round's results go to the parameters as they come.
TEST(Muon, StepNeedsFewMatricesOfWorkingMemory) {
  track_cpu_memory();
  const int64_t matrices = 32, rows = 64, cols = 128;
  const int64_t all_bytes = matrices * rows * cols * 4;
  for (int ranks : {1, 2}) {
    int64_t working = 0;
    comm::run_local_ranks(ranks, [&](int rank) {
      DeviceMesh mesh = init_device_mesh("cpu", {ranks}, {"dp"});
      manual_seed(5);
      std::vector<DTensor> w;
      for (int64_t i = 0; i < matrices; ++i) w.push_back(randn({rows, cols}, mesh, {Shard(0)}));
      std::vector<DTensor*> params;
      for (DTensor& x : w) params.push_back(&x);
      optim::Muon muon(params);
      for (DTensor& x : w) x.to_local().mutable_grad() = at::randn_like(x.to_local());
      comm::barrier(mesh.group(0));
      int64_t before = 0;
      if (rank == 0) before = cpu_memory_allocated(), reset_cpu_memory_peak();
      comm::barrier(mesh.group(0));
      muon.step();
      comm::barrier(mesh.group(0));
      if (rank == 0) working = cpu_memory_peak() - before;
      comm::barrier(mesh.group(0));
    });
    // One rank: a matrix's update and its Newton-Schulz temporaries at a time. Two: the
    // pieces sent and received (one copy of the matrices each, over both ranks) and a round.
    const int64_t bound = ranks == 1 ? all_bytes / 4 : 5 * all_bytes / 2;
    EXPECT_LE(working, bound) << ranks << " ranks: the step allocated " << working << " bytes beyond its state, "
                              << "for matrices of " << all_bytes << " bytes in all";
  }
}

TEST(Muon, GroupsAndShapesAreChecked) {
  comm::run_local_ranks(1, [](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    nn::Llama model(tiny(1), mesh);
    auto named = model.named_parameters();
    std::vector<DTensor*> all = model.parameters();
    // A norm weight is 1-D: not for Muon.
    DTensor* norm = nullptr;
    for (auto& [name, p] : named)
      if (p->dim() == 1) norm = p;
    ASSERT_NE(norm, nullptr);
    EXPECT_THROW(optim::Muon({norm}), hp::Error);
    // The iteration runs in float32 or bfloat16.
    std::vector<DTensor*> matrices;
    for (auto& [name, p] : named)
      if (p->dim() == 2) matrices.push_back(p);
    optim::MuonOptions half;
    half.ns_dtype = at::kHalf;
    EXPECT_THROW(optim::Muon(matrices, half), hp::Error);
    // Every parameter in exactly one group.
    EXPECT_THROW(optim::get_hyper_optimizer(model, {}, {all.begin(), all.end() - 1}), hp::Error);
    EXPECT_THROW(optim::get_hyper_optimizer(model, {all[0]}, all), hp::Error);
    optim::MuonOptions muon;
    muon.lr = 0.02;
    optim::AdamWOptions adamw;
    adamw.lr = 1e-3;
    optim::ChainedOptimizer opt = optim::get_hyper_optimizer(model, muon, adamw);
    opt.set_lr(0.01);  // half the base: every part follows
    EXPECT_DOUBLE_EQ(opt.part(0).lr(), 0.01);
    EXPECT_DOUBLE_EQ(opt.part(1).lr(), 5e-4);
  });
}
