// Redistributions the planner carries out with a FlattenedAllToAll, run on real data, ranks
// as threads over Gloo. Reference: the whole tensor, sliced. After the forward plan every
// rank's piece must equal its slice of the whole tensor exactly (the steps move values, or
// add a value to zeros); after backward (the reverse plan) every rank's gradient must
// equal its slice of the whole gradient exactly. Shapes include sizes the mesh does not
// divide, down to empty pieces.
#include <gtest/gtest.h>

#include <cstdio>

#include "check.h"

using namespace hp;
using namespace hp::testing;

namespace {

bool has_flattened_step(const RedistributePlan& p) {
  for (const auto& s : p.steps)
    if (s.kind == StepKind::FlattenedAllToAll) return true;
  return false;
}

// Placements of a `ndim`-D tensor on a `mesh_ndim`-D mesh: Replicate, a Shard, or, with
// `partial`, Partial(sum) on each mesh dim.
std::vector<std::vector<Placement>> all_placements(int mesh_ndim, int ndim, bool partial) {
  std::vector<Placement> opts{Replicate()};
  for (int t = 0; t < ndim; ++t) opts.push_back(Shard(t));
  if (partial) opts.push_back(Partial());
  std::vector<std::vector<Placement>> out{{}};
  for (int m = 0; m < mesh_ndim; ++m) {
    std::vector<std::vector<Placement>> next;
    for (const auto& ps : out)
      for (const auto& p : opts) {
        next.push_back(ps);
        next.back().push_back(p);
      }
    out = std::move(next);
  }
  return out;
}

struct Pair {
  std::vector<Placement> from, to;
};

// Forward and backward of `from` -> `to` on this rank, against slices of whole tensors.
void check_pair(const DeviceMesh& mesh, const std::vector<int64_t>& shape, const Pair& pair) {
  SCOPED_TRACE("shape " + to_string_list(shape) + " " + to_string_list(pair.from) + " -> " + to_string_list(pair.to));
  const std::vector<int64_t> coord = mesh.coordinate();
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const at::Tensor full = at::arange(numel, at::kDouble).reshape(shape).add(1);
  const at::Tensor weight = at::arange(numel, at::kDouble).reshape(shape).remainder(7).sub(3);

  DTensor x = distribute_tensor(full, mesh, pair.from);
  x.requires_grad_(true);
  DTensor y = x.redistribute(pair.to);
  ASSERT_TRUE(at::equal(y.to_local(), local_piece(full, y.spec(), coord)))
      << "rank " << mesh.rank() << " holds " << y.to_local() << "\n want " << local_piece(full, y.spec(), coord);

  // Loss: every rank's piece times its slice of `weight`, so each rank's gradient is its
  // slice of `weight` in the gradient layout, and the one coming back to x is x's slice.
  (y.to_local() * local_piece(weight, gradient_spec(y.spec()), coord)).sum().backward();
  const at::Tensor grad = x.to_local().grad();
  ASSERT_TRUE(grad.defined());
  const at::Tensor want = local_piece(weight, gradient_spec(x.spec()), coord);
  ASSERT_TRUE(at::equal(grad, want)) << "rank " << mesh.rank() << " gradient " << grad << "\n want " << want;
}

// Every `stride`-th pair of layouts, kept where its plan has a flattened step (planned
// here on a flat network; the ranks plan again on their world's).
std::vector<Pair> sample_pairs(const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& shape, int stride) {
  const MeshShape mesh(mesh_shape);
  const int nd = static_cast<int>(shape.size());
  std::vector<Pair> out;
  int64_t n = 0;
  for (const auto& a : all_placements(mesh.ndim(), nd, true))
    for (const auto& b : all_placements(mesh.ndim(), nd, false)) {
      if (n++ % stride) continue;
      ShardSpec from(shape, 8, mesh, a), to(shape, 8, mesh, b);
      if (has_flattened_step(min_cost_plan(from, to))) out.push_back({a, b});
    }
  return out;
}

void check_mesh(const std::vector<int64_t>& mesh_shape, const std::vector<std::vector<int64_t>>& shapes,
                const std::vector<Pair>& named, int stride) {
  std::vector<std::vector<Pair>> samples;
  for (const auto& shape : shapes) {
    samples.push_back(sample_pairs(mesh_shape, shape, stride));
    ASSERT_GE(samples.back().size(), 8u) << to_string_list(shape);
  }
  size_t pairs = named.size() * shapes.size();
  for (const auto& sample : samples) pairs += sample.size();
  std::printf("mesh %s: %zu pairs with flattened steps, forward and backward\n", to_string_list(mesh_shape).c_str(),
              pairs);
  int64_t n = 1;
  for (int64_t d : mesh_shape) n *= d;
  comm::run_local_ranks(static_cast<int>(n), [&](int) {
    DeviceMesh mesh = init_device_mesh("cpu", mesh_shape);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::vector<int64_t>& shape = shapes[i];
      for (const Pair& p : named) {
        ShardSpec from = make_spec(shape, at::kDouble, mesh, p.from), to = make_spec(shape, at::kDouble, mesh, p.to);
        ASSERT_TRUE(has_flattened_step(*plan_redistribute(from, to, mesh.topology())));
        ASSERT_TRUE(has_flattened_step(*plan_redistribute(to, from, mesh.topology())));  // the backward's
        check_pair(mesh, shape, p);
      }
      for (const Pair& p : samples[i]) check_pair(mesh, shape, p);
    }
  });
}

// The two pairs flattened steps are for: a swap of shard dims (a permutation) and a
// transpose of four row blocks into four column blocks (an all-to-all over all 4 ranks).
const std::vector<Pair> kExamples{{{Shard(0), Shard(1)}, {Shard(1), Shard(0)}},
                                  {{Shard(0), Shard(0)}, {Shard(1), Shard(1)}}};

}  // namespace

TEST(FlattenedRedistribute, Mesh2x2) { check_mesh({2, 2}, {{8, 8}, {7, 5}, {3, 2}}, kExamples, 5); }

TEST(FlattenedRedistribute, Mesh2x2x2) {
  check_mesh({2, 2, 2}, {{8, 4, 6}, {5, 7, 3}},
             {{{Shard(0), Shard(1), Shard(2)}, {Shard(2), Shard(1), Shard(0)}},
              {{Shard(0), Shard(0), Shard(0)}, {Shard(1), Shard(1), Shard(1)}}},
             97);
}

// Runtime plans price steps on the world's hosts: with mesh dim 0 across two hosts, a
// redistribution runs the plan for that topology (here it differs from a flat network's),
// collective for collective.
TEST(FlattenedRedistribute, RuntimePlansUseTheWorldsTopology) {
  comm::run_local_ranks(
      4,
      [&](int) {
        DeviceMesh mesh = init_device_mesh("cpu", {2, 2});
        ShardSpec from = make_spec({256, 256}, at::kFloat, mesh, {Shard(0), Replicate()});
        ShardSpec to = from.with_placements({Shard(1), Replicate()});
        const RedistributePlan& real = *plan_redistribute(from, to, mesh.topology());
        const RedistributePlan& flat = *plan_redistribute(from, to);
        ASSERT_NE(real.to_string(), flat.to_string()) << "pick a pair whose plans differ";

        auto& log = comm::current_world()->collective_log();
        log.clear();
        log.enable();
        at::Tensor full = at::arange(256 * 256, at::kFloat).reshape({256, 256});
        DTensor y = distribute_tensor(full, mesh, from.placements()).redistribute(to.placements());
        log.enable(false);
        std::vector<std::string> ran, planned;
        for (const auto& r : log.records()) ran.push_back(r.op);
        for (const auto& s : real.steps)
          if (is_collective(s.kind)) planned.push_back(s.kind == StepKind::FlattenedAllToAll ? "all_to_all" : to_string(s.kind));
        EXPECT_EQ(ran, planned) << real.to_string();
        EXPECT_TRUE(at::equal(y.to_local(), local_piece(full, y.spec(), mesh.coordinate())));
      },
      std::chrono::seconds(60), /*ranks_per_host=*/2);
}
