// Every DTensor op's result and gradient against the single-device op on the full
// tensors (float64, relative 1e-10), over random layouts on 1-D and 2-D meshes.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cmath>

#include "check.h"

using namespace hp;
using namespace hp::testing;

namespace {

using DOp = std::function<DTensor(const std::vector<DTensor>&)>;
using ROp = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

struct OpCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  DOp dop;
  ROp ref;
  std::vector<bool> integer_input;  // ids: integer inputs, never Partial
};

std::vector<OpCase> op_cases() {
  std::vector<OpCase> c;
  c.push_back({"add broadcast", {{4, 6}, {6}}, [](auto& x) { return add(x[0], x[1]); },
               [](auto& x) { return x[0] + x[1]; }});
  c.push_back({"sub", {{4, 6}, {4, 6}}, [](auto& x) { return sub(x[0], x[1]); },
               [](auto& x) { return x[0] - x[1]; }});
  c.push_back({"mul", {{5, 4}, {5, 4}}, [](auto& x) { return mul(x[0], x[1]); },
               [](auto& x) { return x[0] * x[1]; }});
  c.push_back({"matmul", {{6, 4}, {4, 5}}, [](auto& x) { return matmul(x[0], x[1]); },
               [](auto& x) { return at::matmul(x[0], x[1]); }});
  c.push_back({"bmm", {{2, 4, 6}, {2, 6, 3}}, [](auto& x) { return matmul(x[0], x[1]); },
               [](auto& x) { return at::matmul(x[0], x[1]); }});
  c.push_back({"linear", {{3, 5, 4}, {6, 4}}, [](auto& x) { return linear(x[0], x[1]); },
               [](auto& x) { return at::linear(x[0], x[1]); }});
  c.push_back({"sum", {{4, 6, 2}}, [](auto& x) { return sum(x[0], {1}); },
               [](auto& x) { return x[0].sum({1}); }});
  c.push_back({"mean keepdim", {{4, 6}}, [](auto& x) { return mean(x[0], {1}, true); },
               [](auto& x) { return x[0].mean({1}, true); }});
  c.push_back({"softmax", {{4, 6}}, [](auto& x) { return softmax(x[0], 1); },
               [](auto& x) { return x[0].softmax(1); }});
  c.push_back({"log_softmax", {{4, 6}}, [](auto& x) { return log_softmax(x[0], 0); },
               [](auto& x) { return x[0].log_softmax(0); }});
  c.push_back({"view", {{4, 6}}, [](auto& x) { return view(x[0], {4, 2, 3}); },
               [](auto& x) { return x[0].reshape({4, 2, 3}); }});
  c.push_back({"transpose", {{4, 6, 2}}, [](auto& x) { return transpose(x[0], 0, 2); },
               [](auto& x) { return x[0].transpose(0, 2); }});
  c.push_back({"permute", {{4, 6, 2}}, [](auto& x) { return permute(x[0], {2, 0, 1}); },
               [](auto& x) { return x[0].permute({2, 0, 1}); }});
  c.push_back({"flatten", {{4, 6, 2}}, [](auto& x) { return flatten(x[0], 0, 1); },
               [](auto& x) { return x[0].flatten(0, 1); }});
  c.push_back({"flatten tail", {{4, 6, 2}}, [](auto& x) { return flatten(x[0], 1); },
               [](auto& x) { return x[0].flatten(1); }});
  c.push_back({"unflatten", {{4, 6}}, [](auto& x) { return unflatten(x[0], 1, {2, -1}); },
               [](auto& x) { return x[0].reshape({4, 2, 3}); }});
  c.push_back({"amax", {{4, 6}}, [](auto& x) { return amax(x[0], {1}); },
               [](auto& x) { return x[0].amax({1}); }});
  c.push_back({"amax all keepdim", {{4, 6}}, [](auto& x) { return amax(x[0], {}, true); },
               [](auto& x) { return x[0].amax({0, 1}, true); }});
  c.push_back({"amax empty pieces", {{2, 5}}, [](auto& x) { return amax(x[0], {0}); },
               [](auto& x) { return x[0].amax({0}); }});
  c.push_back({"cat", {{4, 6}, {2, 6}}, [](auto& x) { return cat({x[0], x[1]}, 0); },
               [](auto& x) { return at::cat({x[0], x[1]}, 0); }});
  c.push_back({"cat 3", {{4, 2}, {4, 3}, {4, 1}}, [](auto& x) { return cat({x[0], x[1], x[2]}, -1); },
               [](auto& x) { return at::cat({x[0], x[1], x[2]}, -1); }});
  c.push_back({"narrow", {{4, 6}}, [](auto& x) { return narrow(x[0], 1, -5, 4); },
               [](auto& x) { return x[0].narrow(1, 1, 4); }});
  c.push_back({"split", {{4, 6}},
               [](auto& x) {
                 auto p = split(x[0], {2, 1, 3}, 1);
                 return cat({p[2], p[0], p[1]}, 1);
               },
               [](auto& x) {
                 auto p = x[0].split_with_sizes({2, 1, 3}, 1);
                 return at::cat({p[2], p[0], p[1]}, 1);
               }});
  c.push_back({"chunk middle", {{5, 4}}, [](auto& x) { return chunk(x[0], 3, 0)[1]; },
               [](auto& x) { return x[0].chunk(3, 0)[1]; }});
  c.push_back({"tanh", {{5, 3}}, [](auto& x) { return map(x[0], [](const at::Tensor& t) { return t.tanh(); }); },
               [](auto& x) { return x[0].tanh(); }});
  c.push_back({"rms_norm", {{4, 6}, {6}}, [](auto& x) { return rms_norm(x[0], x[1]); },
               [](auto& x) { return x[0] * at::rsqrt(x[0].pow(2).mean({-1}, true) + 1e-6) * x[1]; }});
  c.push_back({"layer_norm", {{4, 6}, {6}, {6}}, [](auto& x) { return layer_norm(x[0], x[1], x[2]); },
               [](auto& x) { return at::layer_norm(x[0], {6}, x[1], x[2], 1e-5); }});
  c.push_back({"center", {{4, 6}}, [](auto& x) { return sub(x[0], mean(x[0], {-1}, true)); },
               [](auto& x) { return x[0] - x[0].mean({-1}, true); }});
  c.push_back({"sub mean", {{4, 6}, {4, 1}}, [](auto& x) { return sub(x[0], x[1]); },
               [](auto& x) { return x[0] - x[1]; }});
  c.push_back({"embedding", {{8, 3}, {5}}, [](auto& x) { return embedding(x[0], x[1]); },
               [](auto& x) { return at::embedding(x[0], x[1]); }, {false, true}});
  c.push_back({"cross_entropy", {{6, 8}, {6}}, [](auto& x) { return cross_entropy(x[0], x[1]); },
               [](auto& x) { return at::cross_entropy_loss(x[0], x[1]); }, {false, true}});
  // Attention against the explicit form it replaced in nn::Attention: kv heads repeated,
  // scaled scores, future positions masked to -inf, softmax, then the values. 5 positions
  // split unevenly; heads 4 over 2 kv heads.
  for (bool causal : {true, false}) {
    c.push_back({causal ? "attention causal gqa" : "attention gqa", {{2, 4, 5, 6}, {2, 2, 5, 6}, {2, 2, 5, 6}},
                 [causal](auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); },
                 [causal](auto& x) {
                   at::Tensor k = x[1].repeat_interleave(2, 1), v = x[2].repeat_interleave(2, 1);
                   at::Tensor s = at::matmul(x[0] / std::sqrt(6.0), k.transpose(2, 3));
                   if (causal) s = s.masked_fill(at::ones({5, 5}, at::kBool).triu(1), -INFINITY);
                   return at::matmul(s.softmax(-1), v);
                 }});
  }
  return c;
}

at::Tensor make_input(const std::vector<int64_t>& shape, bool integer, int64_t bound) {
  if (integer) return (hp::rand(shape, at::kDouble) * bound).floor().to(at::kLong);
  return hp::randn(shape, at::kDouble);
}

void check_ops(const std::vector<int64_t>& mesh_shape, int layouts_per_op, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : mesh_shape) n *= d;
  comm::run_local_ranks(static_cast<int>(n), [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", mesh_shape);
    std::mt19937 rng(seed);
    for (const OpCase& oc : op_cases()) {
      for (int l = 0; l < layouts_per_op; ++l) {
        manual_seed(l);
        std::vector<at::Tensor> fulls;
        std::vector<std::vector<Placement>> placements;
        for (size_t i = 0; i < oc.shapes.size(); ++i) {
          bool integer = i < oc.integer_input.size() && oc.integer_input[i];
          // ids index the 8 table rows / the 8 classes
          fulls.push_back(make_input(oc.shapes[i], integer, 8));
          placements.push_back(random_placements(rng, mesh.ndim(), oc.shapes[i].size(), !integer));
        }
        expect_op_matches(mesh, fulls, placements, oc.dop, oc.ref, oc.name);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  });
}

}  // namespace

TEST(DTensorOps, MatchSingleDeviceOnMesh2) { check_ops({2}, 8, 11); }
TEST(DTensorOps, MatchSingleDeviceOnMesh3Uneven) { check_ops({3}, 8, 12); }
TEST(DTensorOps, MatchSingleDeviceOnMesh2x2) { check_ops({2, 2}, 8, 13); }

TEST(DTensorOps, LossParallelKeepsLogitsSharded) {
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    manual_seed(5);
    at::Tensor logits = hp::randn({4, 10}, at::kDouble);
    at::Tensor targets = (hp::rand({4}, at::kDouble) * 10).floor().to(at::kLong);
    DTensor z = distribute_tensor(logits, mesh, {Shard(1)});
    z.requires_grad_(true);
    DTensor loss = cross_entropy(z, distribute_tensor(targets, mesh, {Replicate()}));
    loss.to_local().backward();
    // The gradient stays vocabulary-sharded: each rank holds only its 5 columns.
    EXPECT_EQ(z.to_local().grad().sizes(), (at::IntArrayRef{4, 5}));
    at::Tensor ref = logits.clone().requires_grad_(true);
    at::cross_entropy_loss(ref, targets).backward();
    EXPECT_TRUE(close(z.grad()->full_tensor(), ref.grad()));
  });
}

TEST(DTensorOps, AttentionWithShardedHeads) {
  comm::run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    manual_seed(7);
    std::vector<at::Tensor> qkv = {hp::randn({2, 4, 5, 3}, at::kDouble), hp::randn({2, 4, 5, 3}, at::kDouble),
                                   hp::randn({2, 4, 5, 3}, at::kDouble)};
    const double scale = 1.0 / std::sqrt(3.0);
    auto attend = [scale](const std::vector<DTensor>& x) {
      DTensor s = map(matmul(x[0], transpose(x[1], -2, -1)), [scale](const at::Tensor& t) { return t * scale; });
      return matmul(softmax(s, -1), x[2]);
    };
    auto ref = [scale](const std::vector<at::Tensor>& x) {
      return at::matmul((at::matmul(x[0], x[1].transpose(-2, -1)) * scale).softmax(-1), x[2]);
    };
    expect_op_matches(mesh, qkv, {{Shard(1)}, {Shard(1)}, {Shard(1)}}, attend, ref, "attention, heads sharded");
  });
}

// Each draw moves the offset past exactly the counters it consumed: numel for rand and
// dropout, two per value for randn (Box-Muller). Too little and a later draw reuses
// uniforms; too much and a rank that draws differently falls out of step.
TEST(DistributedRng, OffsetAdvancesByTheCountersEachDrawConsumes) {
  comm::run_local_ranks(2, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2});
    manual_seed(7);
    auto offset = [] { return get_rng_state().offset; };
    hp::rand({3, 5});
    EXPECT_EQ(offset(), 15u);
    hp::randn({3, 5});
    EXPECT_EQ(offset(), 45u);
    hp::dropout(at::ones({4}), 0.5);
    EXPECT_EQ(offset(), 49u);
    hp::rand({6, 2}, mesh, {Shard(0)});
    EXPECT_EQ(offset(), 61u);
    hp::randn({6, 2}, mesh, {Shard(1)});
    EXPECT_EQ(offset(), 85u);
    hp::dropout(distribute_tensor(at::ones({6}), mesh, {Shard(0)}), 0.5);
    EXPECT_EQ(offset(), 91u);
    // No counter is used twice: a normal drawn after another equals one drawn from a
    // state that starts exactly past the first draw's counters.
    manual_seed(3);
    hp::randn({10}, at::kDouble);
    at::Tensor second = hp::randn({10}, at::kDouble);
    set_rng_state({3, 20});
    EXPECT_TRUE(at::equal(second, hp::randn({10}, at::kDouble)));
    // ... and a uniform drawn after a normal never repeats one of its uniforms.
    manual_seed(3);
    hp::randn({10}, at::kDouble);
    at::Tensor u = hp::rand({20}, at::kDouble);
    set_rng_state({3, 0});
    at::Tensor consumed = hp::rand({20}, at::kDouble);  // the normal's 20 uniforms
    EXPECT_FALSE(at::isin(u, consumed).any().item<bool>());
  });
}

// Every element is the documented function of its counter: splitmix64 of the counter,
// xored with the seed, splitmix64 again, top 53 bits; a normal is Box-Muller on the
// element's counters 2g and 2g + 1. Checked element by element against that formula,
// here written out again, for whole tensors and for an uneven shard of the last dim, with
// blocks large enough to be drawn on several threads.
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double uniform(uint64_t seed, uint64_t counter) { return (splitmix64(splitmix64(counter) ^ seed) >> 11) * 0x1.0p-53; }
double normal(uint64_t seed, uint64_t counter) {
  const double u1 = 1.0 - uniform(seed, counter), u2 = uniform(seed, counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}
}  // namespace

TEST(DistributedRng, EveryElementIsTheFormulaOfItsCounter) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  const std::vector<int64_t> shape{3, 70, 130};
  manual_seed(11);
  const at::Tensor u = hp::rand(shape, at::kDouble), g = hp::randn(shape, at::kDouble);
  at::set_num_threads(before);
  const int64_t n = 3 * 70 * 130;
  const double *pu = u.const_data_ptr<double>(), *pg = g.const_data_ptr<double>();
  int wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    wrong += pu[i] != uniform(11, static_cast<uint64_t>(i));
    wrong += pg[i] != normal(11, static_cast<uint64_t>(n + 2 * i));  // after the uniforms' n counters
  }
  EXPECT_EQ(wrong, 0);
  // Other dtypes: the float64 numbers rounded once.
  at::set_num_threads(2);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    manual_seed(11);
    const at::Tensor u_as = hp::rand(shape, dtype), g_as = hp::randn(shape, dtype);
    EXPECT_TRUE(at::equal(u_as, u.to(dtype))) << dtype;
    EXPECT_TRUE(at::equal(g_as, g.to(dtype))) << dtype;
  }
  at::set_num_threads(before);
  comm::run_local_ranks(3, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {3});
    manual_seed(11);
    hp::rand(shape, mesh, {Shard(2)});  // the same counters as above
    const DTensor drawn = hp::randn(shape, mesh, {Shard(2)}, at::kDouble);
    const at::Tensor piece = drawn.to_local();
    const int64_t cols = piece.size(2), first = drawn.spec().global_offset(mesh.coordinate())[2];
    int wrong_here = 0;
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t b = 0; b < 70; ++b)
        for (int64_t c = 0; c < cols; ++c)
          wrong_here += piece[a][b][c].item<double>() != normal(11, static_cast<uint64_t>(n + 2 * ((a * 70 + b) * 130 + first + c)));
    EXPECT_EQ(wrong_here, 0) << "rank " << rank;
  });
}

TEST(DistributedRng, ShardsDrawTheirPieceOfTheFullTensor) {
  comm::run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", {2, 2});
    for (auto placements : std::vector<std::vector<Placement>>{
             {Shard(0), Shard(1)}, {Shard(1), Shard(0)}, {Replicate(), Shard(0)}, {Shard(0), Shard(0)}}) {
      manual_seed(42);
      at::Tensor full_u = hp::rand({7, 5});
      at::Tensor full_n = hp::randn({7, 5}, at::kDouble);
      at::Tensor full_d = hp::dropout(at::ones({7, 5}), 0.3);
      manual_seed(42);
      DTensor u = hp::rand({7, 5}, mesh, placements);
      DTensor g = hp::randn({7, 5}, mesh, placements, at::kDouble);
      DTensor d = hp::dropout(distribute_tensor(at::ones({7, 5}), mesh, placements), 0.3);
      EXPECT_TRUE(at::equal(u.full_tensor(), full_u)) << to_string_list(placements);
      EXPECT_TRUE(at::equal(g.full_tensor(), full_n)) << to_string_list(placements);
      EXPECT_TRUE(at::equal(d.full_tensor(), full_d)) << to_string_list(placements);
    }
    // Draws are distinct and the distribution is sane.
    manual_seed(1);
    at::Tensor big = hp::randn({20000}, at::kDouble);
    EXPECT_NEAR(big.mean().item<double>(), 0.0, 0.03);
    EXPECT_NEAR(big.std().item<double>(), 1.0, 0.03);
    at::Tensor kept = hp::dropout(at::ones({20000}), 0.25);
    EXPECT_NEAR((kept > 0).to(at::kDouble).mean().item<double>(), 0.75, 0.02);
  });
}
