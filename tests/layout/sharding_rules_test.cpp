// Sharding propagation checked on data: for every layout of the inputs on a 2x2 mesh,
// each rank runs the op on its local pieces (after redistribution to the chosen input
// layouts) and the results must form the chosen output layout of the global result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "hp/base/error.h"
#include "hp/layout/sharding_propagation.h"
#include "layout/redistribute_sim.h"

using namespace hp;
using sim::Arr;
using V = std::vector<int64_t>;

namespace {

// Reference kernels on dense arrays; `offsets` gives each input's global offset (the
// embedding's ids are global rows).
Arr run_op(const Op& op, const std::vector<Arr>& in, const std::vector<V>& offsets, const V& view_to) {
  std::vector<V> shapes;
  for (const auto& a : in) shapes.push_back(a.shape);
  V out_shape = op.kind == OpKind::View ? view_to : output_shape(op, shapes);
  Arr out = sim::zeros(out_shape);
  switch (op.kind) {
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Elementwise:
      sim::for_each_index(out_shape, [&](const V& i) {
        double acc = op.kind == OpKind::Mul ? 1 : 0;
        for (const auto& a : in) {
          V j(a.shape.size());
          for (size_t d = 0; d < j.size(); ++d) {
            size_t od = d + out_shape.size() - a.shape.size();
            j[d] = a.shape[d] == 1 ? 0 : i[od];
          }
          double x = a.v[sim::flat(a.shape, j)];
          acc = op.kind == OpKind::Mul ? acc * x : acc + x;
        }
        out.v[sim::flat(out_shape, i)] = acc;
      });
      break;
    case OpKind::Matmul:
    case OpKind::Linear: {
      const bool lin = op.kind == OpKind::Linear;
      const int64_t K = in[0].shape[1];
      sim::for_each_index(out_shape, [&](const V& i) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += in[0].v[sim::flat(in[0].shape, {i[0], k})] *
                 in[1].v[lin ? sim::flat(in[1].shape, {i[1], k}) : sim::flat(in[1].shape, {k, i[1]})];
        out.v[sim::flat(out_shape, i)] = acc;
      });
      break;
    }
    case OpKind::Sum:
      sim::for_each_index(in[0].shape, [&](const V& i) {
        V j;
        for (size_t d = 0; d < i.size(); ++d)
          if (std::find(op.dims.begin(), op.dims.end(), static_cast<int64_t>(d)) == op.dims.end()) j.push_back(i[d]);
        out.v[sim::flat(out_shape, j)] += in[0].v[sim::flat(in[0].shape, i)];
      });
      break;
    case OpKind::Softmax: {
      const int d = static_cast<int>(op.dims[0]);
      sim::for_each_index(in[0].shape, [&](const V& i) {
        double z = 0;
        V j = i;
        for (j[d] = 0; j[d] < in[0].shape[d]; ++j[d]) z += std::exp(in[0].v[sim::flat(in[0].shape, j)] / 10);
        out.v[sim::flat(out_shape, i)] = std::exp(in[0].v[sim::flat(in[0].shape, i)] / 10) / z;
      });
      break;
    }
    case OpKind::Embedding: {
      const Arr &table = in[0], &ids = in[1];
      sim::for_each_index(out_shape, [&](const V& i) {
        V id_idx(i.begin(), i.end() - 1);
        int64_t row = static_cast<int64_t>(ids.v[sim::flat(ids.shape, id_idx)]) - offsets[0][0];
        if (row >= 0 && row < table.shape[0])  // rows outside this shard contribute zero
          out.v[sim::flat(out_shape, i)] = table.v[sim::flat(table.shape, {row, i.back()})];
      });
      break;
    }
    case OpKind::Transpose:
      sim::for_each_index(in[0].shape, [&](const V& i) {
        V j = i;
        std::swap(j[op.dims[0]], j[op.dims[1]]);
        out.v[sim::flat(out_shape, j)] = in[0].v[sim::flat(in[0].shape, i)];
      });
      break;
    case OpKind::View: out.v = in[0].v; break;
    case OpKind::Amax: {
      // Empty local pieces leave -inf, which loses to any value in the max reduction.
      std::fill(out.v.begin(), out.v.end(), -INFINITY);
      sim::for_each_index(in[0].shape, [&](const V& i) {
        V j;
        for (size_t d = 0; d < i.size(); ++d) {
          bool reduced = std::find(op.dims.begin(), op.dims.end(), static_cast<int64_t>(d)) != op.dims.end();
          if (!reduced) j.push_back(i[d]);
          else if (op.flag) j.push_back(0);
        }
        double& o = out.v[sim::flat(out_shape, j)];
        o = std::max(o, in[0].v[sim::flat(in[0].shape, i)]);
      });
      break;
    }
    case OpKind::Permute:
      sim::for_each_index(out_shape, [&](const V& i) {
        V j(i.size());
        for (size_t k = 0; k < i.size(); ++k) j[op.dims[k]] = i[k];
        out.v[sim::flat(out_shape, i)] = in[0].v[sim::flat(in[0].shape, j)];
      });
      break;
    case OpKind::Cat: out = sim::concat(in, static_cast<int>(op.dims[0])); break;
    case OpKind::Narrow: {
      V off(out_shape.size(), 0);
      off[op.dims[0]] = op.dims[1];
      out = sim::box(in[0], off, out_shape);
      break;
    }
    case OpKind::Attention: {
      // Causal by global query position (keys are whole); query head h reads kv head h / g.
      const Arr &q = in[0], &k = in[1], &v = in[2];
      const int64_t g = q.shape[1] / k.shape[1], keys = k.shape[2];
      sim::for_each_index(out_shape, [&](const V& i) {
        const int64_t pos = i[2] + offsets[0][2];
        std::vector<double> s;
        for (int64_t j = 0; j < keys && j <= pos; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < q.shape[3]; ++d)
            dot += q.v[sim::flat(q.shape, {i[0], i[1], i[2], d})] * k.v[sim::flat(k.shape, {i[0], i[1] / g, j, d})];
          s.push_back(dot / 100);
        }
        const double top = *std::max_element(s.begin(), s.end());
        double z = 0, acc = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          const double w = std::exp(s[j] - top);
          z += w;
          acc += w * v.v[sim::flat(v.shape, {i[0], i[1] / g, static_cast<int64_t>(j), i[3]})];
        }
        out.v[sim::flat(out_shape, i)] = acc / z;
      });
      break;
    }
    default: ADD_FAILURE() << "no reference kernel for " << op.to_string();
  }
  return out;
}

std::vector<ShardSpec> layouts(const V& shape, const MeshShape& m, bool partial) {
  std::vector<Placement> o{Replicate()};
  for (int t = 0; t < static_cast<int>(shape.size()); ++t) o.push_back(Shard(t));
  if (partial) o.push_back(Partial());
  std::vector<ShardSpec> out;
  for (const auto& a : o)
    for (const auto& b : o) out.emplace_back(shape, 4, m, std::vector<Placement>{a, b});
  return out;
}

// All input layouts; returns how many combinations were checked.
int check_op(const Op& op, const std::vector<Arr>& globals, std::vector<bool> partial_ok = {}) {
  MeshShape m({2, 2});
  if (partial_ok.empty()) partial_ok.assign(globals.size(), true);
  std::vector<std::vector<ShardSpec>> choices;
  for (size_t i = 0; i < globals.size(); ++i) choices.push_back(layouts(globals[i].shape, m, partial_ok[i]));
  std::vector<V> origins;  // each input whole: offset 0 along each of its dims
  for (const Arr& g : globals) origins.emplace_back(g.shape.size(), 0);
  Arr want = run_op(op, globals, origins, {});
  if (op.kind == OpKind::View) want.shape = output_shape(op, {globals[0].shape});
  int checked = 0;
  std::vector<size_t> pick(globals.size(), 0);
  while (true) {
    std::vector<ShardSpec> inputs;
    for (size_t i = 0; i < globals.size(); ++i) inputs.push_back(choices[i][pick[i]]);
    auto d = propagate(op, inputs);
    std::vector<sim::Locals> locals;
    for (size_t i = 0; i < globals.size(); ++i) {
      auto plan = plan_redistribute(inputs[i], d->inputs[i]);
      EXPECT_TRUE(sim::run(*plan, globals[i], inputs[i], d->inputs[i]));
      locals.push_back(sim::distribute(globals[i], d->inputs[i]));
    }
    sim::Locals outs(m.size());
    for (int p = 0; p < m.size(); ++p) {
      std::vector<Arr> in;
      std::vector<V> offs;
      for (size_t i = 0; i < globals.size(); ++i) {
        in.push_back(locals[i][p]);
        offs.push_back(d->inputs[i].global_offset(m.coord_of(m.ranks()[p])));
      }
      outs[p] = run_op(op, in, offs, d->output.local_shape(m.coord_of(m.ranks()[p])));
    }
    auto ok = sim::matches(outs, want, d->output);
    EXPECT_TRUE(ok) << op.to_string() << " on " << inputs[0] << (inputs.size() > 1 ? " and " + inputs[1].to_string() : "")
                    << " -> " << d->output;
    if (!ok) return checked;
    ++checked;
    size_t i = 0;
    for (; i < pick.size(); ++i) {
      if (++pick[i] < choices[i].size()) break;
      pick[i] = 0;
    }
    if (i == pick.size()) break;
  }
  return checked;
}

Arr data(const V& s) { return sim::iota(s); }

}  // namespace

TEST(ShardingRules, EveryLayoutGivesTheRightData) {
  // 16 layouts of a 2-D input on 2x2 with R, S(0), S(1), P(sum); 9 without P or for 1-D.
  EXPECT_EQ(check_op(Op::add(), {data({4, 6}), data({6})}), 16 * 9);
  EXPECT_EQ(check_op(Op::mul(), {data({4, 6}), data({4, 1})}), 16 * 16);
  EXPECT_EQ(check_op(Op::elementwise(2), {data({4, 6}), data({4, 6})}, {false, false}), 9 * 9);
  EXPECT_EQ(check_op(Op::matmul(), {data({4, 6}), data({6, 8})}), 16 * 16);
  EXPECT_EQ(check_op(Op::linear(), {data({4, 6}), data({8, 6})}), 16 * 16);
  EXPECT_EQ(check_op(Op::sum({1}), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::sum({0, 1}), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::softmax(1), {data({4, 6})}, {false}), 9);
  EXPECT_EQ(check_op(Op::transpose(0, 1), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::view({24}), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::view({2, 2, 6}), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::view({18}), {data({3, 6})}), 16);  // uneven: may not stay sharded
  // flatten and unflatten are views
  EXPECT_EQ(check_op(Op::view({24, 2}), {data({4, 6, 2})}), 25);
  EXPECT_EQ(check_op(Op::view({4, 6}), {data({24})}), 9);
  Arr ids = sim::zeros({2, 3});
  for (size_t i = 0; i < ids.v.size(); ++i) ids.v[i] = static_cast<double>((i * 5) % 10);
  EXPECT_EQ(check_op(Op::embedding(), {data({10, 4}), ids}, {true, false}), 16 * 9);
}

TEST(ShardingRules, NewOpsGiveTheRightData) {
  EXPECT_EQ(check_op(Op::amax({1}), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::amax({0, 1}), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::amax({0}, true), {data({3, 6})}), 16);  // an empty piece on 2x2
  EXPECT_EQ(check_op(Op::permute({2, 0, 1}), {data({4, 6, 2})}), 25);
  EXPECT_EQ(check_op(Op::cat(0, 2), {data({4, 6}), data({2, 6})}), 16 * 16);
  EXPECT_EQ(check_op(Op::cat(1, 2), {data({4, 6}), data({4, 2})}), 16 * 16);
  EXPECT_EQ(check_op(Op::cat(1, 3), {data({4, 6}), data({4, 2}), data({4, 3})}), 16 * 16 * 16);
  EXPECT_EQ(check_op(Op::narrow(1, 1, 4), {data({4, 6})}), 16);
  EXPECT_EQ(check_op(Op::narrow(0, 3, 1), {data({4, 6})}), 16);
  // Grouped-query attention, 3 positions (uneven on 2 ranks): every layout of q, k, v.
  EXPECT_EQ(check_op(Op::attention(), {data({2, 4, 3, 2}), data({2, 2, 3, 2}), data({2, 2, 3, 3})},
                     {false, false, false}),
            25 * 25 * 25);
}

TEST(ShardingRules, NewOpsKeepShardsTheyCan) {
  MeshShape m({2, 2});
  ShardSpec x({4, 6}, 4, m, {Shard(0), Shard(1)});
  // amax over a sharded dim: local maxima pending a max, no communication.
  auto d = propagate(Op::amax({1}), {x});
  EXPECT_EQ(d->output.placements(), (std::vector<Placement>{Shard(0), Partial(ReduceOp::Max)}));
  EXPECT_EQ(d->cost.seconds, 0);
  d = propagate(Op::permute({1, 0}), {x});
  EXPECT_EQ(d->output.placements(), (std::vector<Placement>{Shard(1), Shard(0)}));
  // cat keeps the shard of the other dim and gathers the one of the cat dim.
  ShardSpec y({2, 6}, 4, m, {Shard(0), Shard(1)});
  d = propagate(Op::cat(0, 2), {x, y});
  EXPECT_EQ(d->output.placement(1), Shard(1));
  EXPECT_FALSE(d->inputs[0].placement(0).is_shard(0));
  EXPECT_EQ(d->output.shape(), (V{6, 6}));
  d = propagate(Op::narrow(0, 1, 2), {x});
  EXPECT_EQ(d->output.placement(1), Shard(1));
  EXPECT_FALSE(d->output.placement(0).is_shard(0));
  EXPECT_THROW(output_shape(Op::cat(0, 2), {{4, 6}, {4, 5}}), Error);
  EXPECT_THROW(output_shape(Op::narrow(1, 4, 3), {{4, 6}}), Error);
  EXPECT_THROW(output_shape(Op::permute({0, 0}), {{4, 6}}), Error);
}

TEST(ShardingRules, ChoosesTheSignatureTheInputsAlreadyHave) {
  MeshShape m({2});
  // Row-parallel linear: input sharded on features, weight on its input dim -> partial sum.
  ShardSpec x({8, 16}, 4, m, {Shard(1)}), w({32, 16}, 4, m, {Shard(1)});
  auto d = propagate(Op::linear(), {x, w});
  EXPECT_EQ(d->output.placement(0), Partial());
  EXPECT_EQ(d->cost.seconds, 0);
  // Column-parallel: weight sharded on outputs -> output sharded on its last dim.
  d = propagate(Op::linear(), {x.with_placements({Replicate()}), w.with_placements({Shard(0)})});
  EXPECT_EQ(d->output.placement(0), Shard(1));
  EXPECT_EQ(d->cost.seconds, 0);
  // Vocab-parallel embedding -> partial sum.
  d = propagate(Op::embedding(), {ShardSpec({1000, 64}, 4, m, {Shard(0)}), ShardSpec({4, 8}, 8, m, {Replicate()})});
  EXPECT_EQ(d->output.placement(0), Partial());
  EXPECT_EQ(d->output.shape(), (V{4, 8, 64}));
  // Replicated inputs stay replicated rather than chunking for free.
  d = propagate(Op::add(), {x.with_placements({Replicate()}), x.with_placements({Replicate()})});
  EXPECT_EQ(d->output.placement(0), Replicate());
}

TEST(ShardingRules, RedistributesAsCheaplyAsPossible) {
  MeshShape m({4});
  // Softmax along the sharded dim: moving the shard to the other dim (all_to_all) beats
  // gathering the whole row block.
  ShardSpec x({64, 64}, 4, m, {Shard(1)});
  auto d = propagate(Op::softmax(1), {x});
  EXPECT_EQ(d->inputs[0].placement(0), Shard(0));
  EXPECT_GT(d->cost.seconds, 0);
  EXPECT_LT(d->cost.seconds, min_cost_plan(x, x.with_placements({Replicate()})).cost.seconds);
  // Mean over an unevenly sharded dim cannot average partial means.
  ShardSpec u({6, 5}, 4, m, {Shard(1)});
  d = propagate(Op::mean({1}), {u});
  EXPECT_FALSE(d->output.placement(0).is_partial());
  d = propagate(Op::mean({1}), {ShardSpec({6, 8}, 4, m, {Shard(1)})});
  EXPECT_EQ(d->output.placement(0), Partial(ReduceOp::Avg));
}

TEST(ShardingRules, ShapesAndErrors) {
  EXPECT_EQ(output_shape(Op::add(), {{4, 1, 6}, {5, 1}}), (V{4, 5, 6}));
  EXPECT_EQ(output_shape(Op::matmul(), {{2, 3, 4}, {4, 5}}), (V{2, 3, 5}));
  EXPECT_EQ(output_shape(Op::sum({-1}, true), {{2, 3}}), (V{2, 1}));
  EXPECT_EQ(output_shape(Op::view({-1, 4}), {{2, 6}}), (V{3, 4}));
  try {
    output_shape(Op::matmul(), {{2, 3}, {4, 5}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] and [4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(output_shape(Op::add(), {{3}, {4}}), Error);
  EXPECT_THROW(output_shape(Op::view({5}), {{2, 3}}), Error);
  EXPECT_THROW(propagate(Op::linear(), {ShardSpec({4}, 4, MeshShape({2}), {Replicate()})}), Error);
}

TEST(ShardingRules, DecisionsAreCached) {
  clear_propagation_cache();
  ShardSpec x({8, 8}, 4, MeshShape({2}), {Shard(0)});
  auto a = propagate(Op::transpose(0, 1), {x});
  EXPECT_EQ(a.get(), propagate(Op::transpose(0, 1), {x}).get());
  EXPECT_EQ(a->output.placement(0), Shard(1));
  propagate(Op::transpose(0, 1), {x.with_placements({Replicate()})});
  EXPECT_EQ(propagation_cache_size(), 2u);
}

TEST(ShardingRules, ViewKeepsAShardThatItsOwnRanksDivide) {
  // Logits [B, S, V] -> [B*S, V] with one row per dp rank on a dp x tp mesh: the rows stay
  // split over dp (B = 4 divides over dp = 4, though not over the whole mesh of 8).
  MeshShape m({4, 2});
  ShardSpec logits({4, 16, 8}, 4, m, {Shard(0), Shard(2)});
  auto d = propagate(Op::view({64, 8}), {logits});
  EXPECT_EQ(d->output.placements(), (std::vector<Placement>{Shard(0), Shard(1)}));
  EXPECT_EQ(d->cost.seconds, 0);
  // Both mesh dims on the batch: 8 ranks split 4 rows unevenly, so the view needs a move.
  d = propagate(Op::view({64, 8}), {logits.with_placements({Shard(0), Shard(0)})});
  EXPECT_GT(d->cost.seconds, 0);
}
