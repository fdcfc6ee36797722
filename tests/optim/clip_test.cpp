// Global-norm clipping against the norm of the full gradients computed on one process:
// parameters on 1-D and 2-D meshes (3, 4 and 6 ranks), sharded, replicated and sharded
// over two mesh dims, uneven shards, one parameter whose gradient exists on some ranks
// only. Every rank's norm and clipped gradient pieces are compared (float64, rtol 1e-12),
// and the collectives issued are counted: one per sharded mesh dim of each layout, not
// one per parameter.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "hp/comm/local_ranks.h"
#include "hp/comm/world.h"
#include "hp/optim/adamw.h"
#include "hp/tensor.h"

using namespace hp;

namespace {

// `full` where mesh rank 0's piece of `layout` lies, zeros elsewhere.
at::Tensor rank0_part(const at::Tensor& full, const DTensor& layout) {
  const std::vector<int64_t> coord(layout.device_mesh().ndim(), 0);
  const auto offset = layout.spec().global_offset(coord), shape = layout.spec().local_shape(coord);
  at::Tensor part = at::zeros_like(full), window = part, source = full;
  for (size_t d = 0; d < offset.size(); ++d) {
    window = window.narrow(d, offset[d], shape[d]);
    source = source.narrow(d, offset[d], shape[d]);
  }
  window.copy_(source);
  return part;
}

struct ParamCase {
  std::vector<int64_t> shape;
  std::vector<Placement> placements;
};

struct MeshCase {
  std::vector<int64_t> mesh;
  std::vector<ParamCase> params;
  size_t collectives;  // per rank: one per sharded mesh dim of each distinct layout
};

void check_clip(const MeshCase& mc, double max_norm) {
  int world = 1;
  for (int64_t e : mc.mesh) world *= static_cast<int>(e);
  std::vector<double> norms(world);
  std::mutex mu;
  comm::run_local_ranks(world, [&](int rank) {
    DeviceMesh mesh = init_device_mesh("cpu", mc.mesh);
    manual_seed(11);  // hp's generator is per thread: every rank draws the same tensors
    std::vector<at::Tensor> full_grads;
    std::vector<DTensor> params;
    for (const ParamCase& pc : mc.params) {
      at::Tensor full = hp::randn(pc.shape, at::kDouble);
      full_grads.push_back(hp::randn(pc.shape, at::kDouble));
      params.push_back(distribute_tensor(full, mesh, pc.placements));
      params.back().requires_grad_(true);
    }
    // The last parameter's gradient reaches only the ranks whose piece a token touched:
    // rank 0 holds none, and the full gradient has zeros there.
    for (size_t i = 0; i < params.size(); ++i) {
      const bool last = i + 1 == params.size();
      DTensor piece = distribute_tensor(full_grads[i], mesh, mc.params[i].placements);
      if (last) full_grads[i] -= rank0_part(full_grads[i], piece);
      if (last && rank == 0) continue;
      params[i].to_local().mutable_grad() = piece.to_local().clone();
    }
    double want_sq = 0;
    for (const at::Tensor& g : full_grads) want_sq += g.square().sum().item<double>();
    const double want = std::sqrt(want_sq);

    std::vector<DTensor*> ptrs;
    for (DTensor& p : params) ptrs.push_back(&p);
    auto& log = comm::current_world()->collective_log();
    log.clear();
    log.enable();
    const double got = optim::clip_grad_norm_(ptrs, max_norm);
    log.enable(false);
    EXPECT_EQ(log.records().size(), mc.collectives) << "rank " << rank;
    EXPECT_NEAR(got, want, 1e-12 * want) << "rank " << rank;

    const double coef = want > max_norm ? max_norm / (want + 1e-6) : 1.0;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor expected = distribute_tensor(full_grads[i] * coef, mesh, mc.params[i].placements).to_local();
      const at::Tensor& g = params[i].to_local().grad();
      if (!g.defined()) continue;
      EXPECT_TRUE(at::allclose(g, expected, 1e-12, 1e-14)) << "rank " << rank << " param " << i;
    }
    std::lock_guard<std::mutex> lock(mu);
    norms[rank] = got;
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(norms[r], norms[0]) << "rank " << r << " disagrees with rank 0";
}

// Many parameters of one layout still cost one collective per sharded dim.
std::vector<ParamCase> many(const std::vector<int64_t>& shape, const std::vector<Placement>& placements, int n) {
  return std::vector<ParamCase>(n, ParamCase{shape, placements});
}

MeshCase one_dim_three_ranks() {
  MeshCase mc{{3}, many({7, 5}, {Shard(0)}, 6), 1};
  mc.params.push_back({{4}, {Replicate()}});
  mc.params.push_back({{5, 2}, {Shard(0)}});  // uneven: 2, 2, 1 rows
  return mc;
}

MeshCase two_dims_four_ranks() {
  MeshCase mc{{2, 2}, many({6, 5}, {Shard(0), Shard(1)}, 4), 0};
  for (auto& p : many({5, 3}, {Replicate(), Shard(0)}, 3)) mc.params.push_back(p);
  mc.params.push_back({{3, 4}, {Replicate(), Replicate()}});
  mc.params.push_back({{9, 2}, {Shard(0), Shard(0)}});
  // Layouts: sharded over {0, 1} (twice: 4 params and the last), over {1}, over none.
  mc.collectives = 2 + 1;
  return mc;
}

MeshCase two_dims_six_ranks() {
  MeshCase mc{{3, 2}, many({7, 3}, {Shard(1), Replicate()}, 5), 1 + 2};
  mc.params.push_back({{5, 5}, {Shard(0), Shard(1)}});
  return mc;
}

}  // namespace

TEST(ClipGradNorm, ThreeRanksUneven) { check_clip(one_dim_three_ranks(), 0.5); }
TEST(ClipGradNorm, FourRanksTwoDims) { check_clip(two_dims_four_ranks(), 0.5); }
TEST(ClipGradNorm, SixRanksTwoDims) { check_clip(two_dims_six_ranks(), 0.5); }
TEST(ClipGradNorm, BelowTheLimitLeavesGradientsAlone) { check_clip(two_dims_four_ranks(), 1e9); }
