// FP8 quantization and the FP8 linear against the hand-written float64 reference of
// fp8_reference.h. Round trips are exact values. The linear's output and gradients
// (float32 products of the quantized operands) match the float64 products of the same
// quantized values within relative 1e-5, absolute 1e-5 (values of order 1); the
// quantized operands themselves are the same on every layout, since amaxes are exact.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "hp/comm/local_ranks.h"
#include "hp/tensor.h"
#include "hp/tensor/fp8_linear.h"
#include "hp/tensor/fp8_operand.h"
#include "parallel/fp8_reference.h"

using namespace hp;

namespace {

const Fp8Format kE4 = Fp8Format::E4M3, kE5 = Fp8Format::E5M2;
const Fp8Scaling kScalings[] = {Fp8Scaling::Tensorwise, Fp8Scaling::Rowwise, Fp8Scaling::MxBlock};

at::Tensor round_trip_unscaled(std::vector<float> v, Fp8Format f) {
  at::Tensor t = at::tensor(v, at::kFloat);
  return fp8_round_trip(t, at::ones({}, at::kFloat), f);
}

void expect_values(const at::Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].item<double>(), want[i]) << "element " << i;
}

}  // namespace

TEST(Fp8Quantize, E4m3SaturatesAndKeepsSubnormals) {
  // 0.1 = 12.8 steps of 2^-7 -> 13; 2^-10 ties between 0 and 2^-9 -> 0 (even);
  // 3 * 2^-10 ties between 2^-9 and 2^-8 -> 2^-8 (even); 464 and beyond saturate.
  expect_values(round_trip_unscaled({448, 500, -1e6, 0.1f, 0x1p-9f, 0x1p-10f, 0x3p-10f, -0.0f}, kE4),
                {448, 448, -448, 0.1015625, 0x1p-9, 0, 0x1p-8, 0});
  for (float v : {448.0f, 500.0f, -1e6f, 0.1f, 0x1p-9f, 0x3p-10f, 17.0f})
    EXPECT_EQ(round_trip_unscaled({v}, kE4).item<double>(),
              hp::testing::round_to_fp8(std::clamp<double>(v, -448, 448), kE4)) << v;
}

TEST(Fp8Quantize, E5m2SaturatesAndKeepsSubnormals) {
  // E5M2: largest 57344 = 1.75 * 2^15, smallest subnormal 2^-16; 0.1 is 6.4 steps of 2^-6 -> 0.09375.
  expect_values(round_trip_unscaled({57344, 60000, -1e9, 0x1p-16f, 0x1p-17f, 0x3p-17f, 0.1f}, kE5),
                {57344, 57344, -57344, 0x1p-16, 0, 0x1p-15, 0.09375});
}

TEST(Fp8Quantize, ScalesFollowTheRules) {
  at::Tensor amax = at::tensor(std::vector<float>{2, 0, 500, 448, 0.75f, 1}, at::kFloat);
  expect_values(fp8_scale(amax, kE4, Fp8Scaling::Tensorwise), {224, 1, 448.0f / 500.0f, 1, 448.0f / 0.75f, 448});
  // Powers of two putting the amax in the top binade: floor(log2 amax) -> 2^(8 - it).
  expect_values(fp8_scale(amax, kE4, Fp8Scaling::MxBlock), {128, 1, 1, 1, 512, 256});
  expect_values(fp8_scale(amax, kE5, Fp8Scaling::MxBlock), {0x1p14, 1, 0x1p7, 0x1p7, 0x1p16, 0x1p15});
  // A denormal amax does not give an infinite scale.
  EXPECT_TRUE(std::isfinite(fp8_scale(at::tensor({1e-44f}), kE4, Fp8Scaling::Tensorwise).item<float>()));
}

TEST(Fp8Quantize, MxBlockOf500SaturatesAsOcpMx) {
  // amax 500 has floor(log2) = 8: scale 1, so 500 -> 448 (the shared exponent's rule).
  at::Tensor x = at::tensor(std::vector<float>{500, 1}).reshape({1, 2});
  at::Tensor q = fp8_round_trip(x, fp8_scale(at::tensor(500.0f), kE4, Fp8Scaling::MxBlock), kE4);
  expect_values(q.flatten(), {448, 1});
}

// A [3, 40] matrix: a row of zeros, blocks 32 + 8 (the last one short), wide ranges.
at::Tensor awkward_matrix() {
  at::Tensor a = at::randn({3, 40}, at::TensorOptions().dtype(at::kFloat));
  a[0].zero_();
  a[1][33] = 1000;   // the short block's own amax
  a[1][3] = 1e-3f;   // subnormal after scaling by the whole row's amax
  a[2] *= 1e-6;      // small values: large scales
  return a;
}

TEST(Fp8Quantize, EveryScalingMatchesTheReference) {
  at::manual_seed(3);
  at::Tensor a = awkward_matrix();
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    ShardSpec spec = distribute_tensor(a, mesh, {Replicate()}).spec();
    Fp8Operand op{a, fp8_axis(spec, {0}, 0), fp8_axis(spec, {0}, 1)};
    for (Fp8Scaling s : kScalings)
      for (Fp8Format f : {kE4, kE5}) {
        at::Tensor got = fp8_fake_quantize(op, f, s, mesh).to(at::kDouble);
        at::Tensor want = hp::testing::reference_fake_quantize(a, f, s);
        EXPECT_TRUE(at::allclose(got, want, 1e-7, 0)) << to_string(s) << ": max diff " << (got - want).abs().max();
        EXPECT_TRUE(at::equal(got[0], at::zeros({40}, at::kDouble))) << "a row of zeros stays zeros";
      }
    // The short last block has its own scale: 1000 is exact there, and the first block's
    // values do not see it.
    at::Tensor mx = fp8_amax(op, Fp8Scaling::MxBlock, mesh);
    EXPECT_EQ(mx[1][39].item<float>(), 1000.0f);
    EXPECT_EQ(mx[1][0].item<float>(), a[1].narrow(0, 0, 32).abs().max().item<float>());
  });
}

TEST(Fp8Quantize, BlocksAndRowsStraddlingShardsUseTheWholeAmax) {
  at::manual_seed(4);
  at::Tensor a = awkward_matrix();
  a[2][25] = 7;  // in block 0, on rank 1 when the 40 columns are split 20 / 20
  comm::run_local_ranks(2, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {2}, {"tp"});
    DTensor d = distribute_tensor(a, mesh, {Shard(1)});
    const std::vector<int64_t> coord = mesh.coordinate();
    Fp8Operand op{d.to_local(), fp8_axis(d.spec(), coord, 0), fp8_axis(d.spec(), coord, 1)};
    const int64_t first = d.spec().global_offset(coord)[1];
    for (Fp8Scaling s : kScalings) {
      at::Tensor got = fp8_fake_quantize(op, kE4, s, mesh).to(at::kDouble);
      at::Tensor want = hp::testing::reference_fake_quantize(a, kE4, s).narrow(1, first, 20);
      EXPECT_TRUE(at::allclose(got, want, 1e-7, 0)) << to_string(s) << " on rank " << mesh.rank();
    }
    EXPECT_EQ(fp8_amax(op, Fp8Scaling::MxBlock, mesh)[2][0].item<float>(), 7.0f);
  });
}

// One Linear's layouts: x and W placements on a one-dim mesh of `ranks`.
struct LinearLayout {
  const char* name;
  int ranks;
  Placement x, w;
};
const LinearLayout kLayouts[] = {
    {"single", 1, Replicate(), Replicate()},
    {"column parallel", 2, Replicate(), Shard(0)},
    {"row parallel", 2, Shard(2), Shard(1)},
    {"data parallel", 2, Shard(0), Replicate()},
    {"row parallel, uneven", 3, Shard(2), Shard(1)},
};

TEST(Fp8Linear, ForwardAndBackwardMatchTheReference) {
  at::manual_seed(5);
  at::Tensor x = at::randn({2, 5, 40});
  x[1][2].zero_();
  x[0][1][37] = 30;
  at::Tensor w = at::randn({24, 40}) / std::sqrt(40.0);
  at::Tensor dy = at::randn({2, 5, 24}) * 1e-3;
  for (Fp8Scaling s : kScalings) {
    auto ref = hp::testing::reference_fp8_linear(x.reshape({10, 40}), w, dy.reshape({10, 24}), s);
    for (const auto& layout : kLayouts) {
      SCOPED_TRACE(std::string(to_string(s)) + ", " + layout.name);
      comm::run_local_ranks(layout.ranks, [&](int) {
        DeviceMesh mesh = init_device_mesh("cpu", {layout.ranks}, {"tp"});
        DTensor dx = distribute_tensor(x, mesh, {layout.x}), dw = distribute_tensor(w, mesh, {layout.w});
        dx.requires_grad_(true);
        dw.requires_grad_(true);
        Fp8LinearOptions o;
        o.scaling = s;
        at::Tensor y = Fp8Linear(o)(dx, dw).full_tensor();
        (y * dy).sum().backward();
        auto close = [](const at::Tensor& got, const at::Tensor& want) {
          return at::allclose(got.to(at::kDouble).reshape(want.sizes()), want, 1e-5, 1e-5);
        };
        EXPECT_TRUE(close(y, ref.y)) << "y";
        EXPECT_TRUE(close(dx.grad()->full_tensor(), ref.dx)) << "dX";
        EXPECT_TRUE(close(dw.grad()->full_tensor(), ref.dw)) << "dW";
      });
    }
  }
}

TEST(Fp8Linear, QuantizationChangesTheProduct) {
  // Guards against a swap that silently falls back to float32.
  at::manual_seed(6);
  at::Tensor x = at::randn({4, 40}), w = at::randn({8, 40});
  comm::run_local_ranks(1, [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
    DTensor y = Fp8Linear()(distribute_tensor(x, mesh, {Replicate()}), distribute_tensor(w, mesh, {Replicate()}));
    EXPECT_FALSE(at::allclose(y.to_local(), at::linear(x, w), 1e-4, 1e-4));
    EXPECT_TRUE(at::allclose(y.to_local(), at::linear(x, w), 0.1, 0.1));
  });
}

// bfloat16 operands (fully_shard's mixed precision) are quantized from their float32
// values, which are exact: output and gradients are the float32 run's on the same values,
// rounded to bfloat16 (equal within bfloat16's half ulp, relative 2^-8).
TEST(Fp8Linear, Bfloat16OperandsGiveTheFloat32ResultRounded) {
  at::manual_seed(7);
  at::Tensor x = at::randn({6, 40}).to(at::kBFloat16), w = at::randn({8, 40}).to(at::kBFloat16);
  at::Tensor dy = at::randn({6, 8}).to(at::kBFloat16).to(at::kFloat);  // the same values in both runs
  for (Fp8Scaling s : kScalings) {
    SCOPED_TRACE(to_string(s));
    comm::run_local_ranks(1, [&](int) {
      DeviceMesh mesh = init_device_mesh("cpu", {1}, {"dp"});
      Fp8LinearOptions o;
      o.scaling = s;
      auto run = [&](at::ScalarType t) {
        DTensor dx = distribute_tensor(x.to(t), mesh, {Replicate()}), dw = distribute_tensor(w.to(t), mesh, {Replicate()});
        dx.requires_grad_(true);
        dw.requires_grad_(true);
        DTensor y = Fp8Linear(o)(dx, dw);
        EXPECT_EQ(y.scalar_type(), t);
        (y.to_local() * dy.to(t)).sum().backward();
        EXPECT_EQ(dx.grad()->scalar_type(), t);
        return std::vector<at::Tensor>{y.to_local().to(at::kFloat), dx.grad()->to_local().to(at::kFloat),
                                       dw.grad()->to_local().to(at::kFloat)};
      };
      const auto want = run(at::kFloat), got = run(at::kBFloat16);
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(at::allclose(got[i], want[i].to(at::kBFloat16).to(at::kFloat), 1.0 / 256, 1e-6)) << "output " << i;
    });
  }
}
