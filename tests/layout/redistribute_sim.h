// A tiny data-level simulator of redistribution steps, independent of the planner: every
// rank's local piece is a dense N-D array of doubles, and each step is applied with its
// documented semantics inside every group along its mesh dim.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "hp/layout/redistribute_plan.h"

namespace sim {

using Shape = std::vector<int64_t>;

struct Arr {
  Shape shape;
  std::vector<double> v;
};

inline int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline int64_t flat(const Shape& shape, const Shape& idx) {
  int64_t f = 0;
  for (size_t i = 0; i < shape.size(); ++i) f = f * shape[i] + idx[i];
  return f;
}

inline void for_each_index(const Shape& shape, const std::function<void(const Shape&)>& f) {
  if (numel(shape) == 0) return;
  Shape idx(shape.size(), 0);
  while (true) {
    f(idx);
    int i = static_cast<int>(shape.size()) - 1;
    for (; i >= 0; --i) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
    if (i < 0) return;
  }
}

inline Arr zeros(const Shape& s) { return {s, std::vector<double>(numel(s), 0.0)}; }

// The box of `a` at `offset` with `shape`.
inline Arr box(const Arr& a, const Shape& offset, const Shape& shape) {
  Arr out = zeros(shape);
  for_each_index(shape, [&](const Shape& i) {
    Shape j = i;
    for (size_t d = 0; d < j.size(); ++d) j[d] += offset[d];
    out.v[flat(shape, i)] = a.v[flat(a.shape, j)];
  });
  return out;
}

inline Arr chunk(const Arr& a, int dim, int64_t k, int64_t i) {
  hp::ChunkRange r = hp::chunk_range(a.shape[dim], k, i);
  Shape off(a.shape.size(), 0), s = a.shape;
  off[dim] = r.offset;
  s[dim] = r.size;
  return box(a, off, s);
}

inline Arr concat(const std::vector<Arr>& parts, int dim) {
  Shape s = parts[0].shape;
  s[dim] = 0;
  for (const auto& p : parts) s[dim] += p.shape[dim];
  Arr out = zeros(s);
  int64_t at = 0;
  for (const auto& p : parts) {
    for_each_index(p.shape, [&](const Shape& i) {
      Shape j = i;
      j[dim] += at;
      out.v[flat(s, j)] = p.v[flat(p.shape, i)];
    });
    at += p.shape[dim];
  }
  return out;
}

inline Arr reduce(const std::vector<Arr>& in, hp::ReduceOp op) {
  Arr out = in[0];
  for (size_t m = 1; m < in.size(); ++m) {
    EXPECT_EQ(in[m].shape, out.shape) << "reduced pieces differ in shape";
    if (in[m].shape != out.shape) return out;
    for (size_t e = 0; e < out.v.size(); ++e) {
      double x = in[m].v[e];
      switch (op) {
        case hp::ReduceOp::Sum:
        case hp::ReduceOp::Avg: out.v[e] += x; break;
        case hp::ReduceOp::Max: out.v[e] = std::max(out.v[e], x); break;
        case hp::ReduceOp::Min: out.v[e] = std::min(out.v[e], x); break;
        case hp::ReduceOp::Product: out.v[e] *= x; break;
      }
    }
  }
  if (op == hp::ReduceOp::Avg)
    for (double& x : out.v) x /= static_cast<double>(in.size());
  return out;
}

// Local pieces, indexed by position in the mesh (row-major).
using Locals = std::vector<Arr>;

inline int pos_of(const hp::MeshShape& m, int rank) {
  return static_cast<int>(std::find(m.ranks().begin(), m.ranks().end(), rank) - m.ranks().begin());
}

inline double noise(int64_t q, int64_t e) { return static_cast<double>((q * 7919 + e * 104729) % 13 + 1); }

// Every rank's piece of `global` under `spec`; partial terms get distinct, exact values.
inline Locals distribute(const Arr& global, const hp::ShardSpec& spec) {
  const hp::MeshShape& m = spec.mesh();
  std::vector<int> pdims;
  double K = 1;  // avg dims divide the sum of the terms by their sizes
  hp::ReduceOp kind = hp::ReduceOp::Sum;
  int64_t Q = 1;
  for (int d = 0; d < m.ndim(); ++d)
    if (spec.placement(d).is_partial()) {
      pdims.push_back(d);
      Q *= m.dim_size(d);
      hp::ReduceOp op = spec.placement(d).op();
      if (op == hp::ReduceOp::Avg) K *= static_cast<double>(m.dim_size(d));
      if (op == hp::ReduceOp::Max || op == hp::ReduceOp::Min) kind = op;
    }
  Locals out(m.size());
  for (int p = 0; p < m.size(); ++p) {
    Shape c = m.coord_of(m.ranks()[p]);
    Arr a = box(global, spec.global_offset(c), spec.local_shape(c));
    int64_t q = 0;
    for (int d : pdims) q = q * m.dim_size(d) + c[d];
    Shape off = spec.global_offset(c);
    for_each_index(a.shape, [&](const Shape& i) {
      Shape g = i;
      for (size_t d = 0; d < g.size(); ++d) g[d] += off[d];
      int64_t e = flat(global.shape, g);
      double& x = a.v[flat(a.shape, i)];
      if (kind == hp::ReduceOp::Max) {
        if (q) x -= noise(q, e);
      } else if (kind == hp::ReduceOp::Min) {
        if (q) x += noise(q, e);
      } else if (q) {
        x = noise(q, e);
      } else {
        double rest = 0;
        for (int64_t r = 1; r < Q; ++r) rest += noise(r, e);
        x = x * K - rest;
      }
    });
    out[p] = a;
  }
  return out;
}

// Every rank holds `spec`'s local shape, and the terms of each partial group reduce to
// that rank's box of `global`.
inline ::testing::AssertionResult matches(const Locals& locals, const Arr& global,
                                          const hp::ShardSpec& spec) {
  const hp::MeshShape& m = spec.mesh();
  for (int p = 0; p < m.size(); ++p) {
    Shape c = m.coord_of(m.ranks()[p]);
    if (locals[p].shape != spec.local_shape(c))
      return ::testing::AssertionFailure() << "rank " << m.ranks()[p] << " has a piece of the wrong shape";
    std::vector<Arr> terms;
    hp::ReduceOp kind = hp::ReduceOp::Sum;
    double K = 1;
    for (int q = 0; q < m.size(); ++q) {
      Shape cq = m.coord_of(m.ranks()[q]);
      bool same = true;
      for (int d = 0; d < m.ndim(); ++d) {
        if (spec.placement(d).is_partial()) continue;
        same = same && cq[d] == c[d];
      }
      if (same) terms.push_back(locals[q]);
    }
    for (int d = 0; d < m.ndim(); ++d)
      if (spec.placement(d).is_partial()) {
        hp::ReduceOp op = spec.placement(d).op();
        if (op == hp::ReduceOp::Avg) K *= static_cast<double>(m.dim_size(d));
        if (op == hp::ReduceOp::Max || op == hp::ReduceOp::Min) kind = op;
      }
    Arr r = reduce(terms, kind);
    if (kind == hp::ReduceOp::Sum)
      for (double& x : r.v) x /= K;
    Arr want = box(global, spec.global_offset(c), spec.local_shape(c));
    for (size_t e = 0; e < want.v.size(); ++e)
      if (std::abs(r.v[e] - want.v[e]) > 1e-9 * (1 + std::abs(want.v[e])))
        return ::testing::AssertionFailure()
               << "rank " << m.ranks()[p] << " element " << e << ": " << r.v[e] << " != " << want.v[e];
  }
  return ::testing::AssertionSuccess();
}

// A flattened all-to-all by its meaning alone: every rank of each group along the step's
// mesh dims ends with its piece of `to`, each element copied from any member that holds it
// or, where `from` is Partial on those dims, reduced over one holder of each term. False
// when some element or term is held by no member (the data would have to leave the group).
inline bool apply_flattened(const hp::RedistributeStep& s, Locals& locals) {
  const hp::MeshShape& m = s.from.mesh();
  // The term a member holds: its coordinates on the step's partial dims.
  auto term = [&](const Shape& c) {
    int64_t q = 0;
    for (int d : s.mesh_dims)
      if (s.from.placement(d).is_partial()) q = q * m.dim_size(d) + c[d];
    return q;
  };
  int64_t terms = 1;
  hp::ReduceOp kind = hp::ReduceOp::Sum;
  double avg = 1;
  for (int d : s.mesh_dims) {
    const hp::Placement& p = s.from.placement(d);
    if (!p.is_partial()) continue;
    terms *= m.dim_size(d);
    if (p.op() == hp::ReduceOp::Avg) avg *= static_cast<double>(m.dim_size(d));
    if (p.op() == hp::ReduceOp::Max || p.op() == hp::ReduceOp::Min) kind = p.op();
  }
  Locals next = locals;
  for (const auto& g : m.groups_along(s.mesh_dims)) {
    for (int dst : g) {
      const Shape c = m.coord_of(dst), off = s.to.global_offset(c);
      Arr& out = next[pos_of(m, dst)];
      out = zeros(s.to.local_shape(c));
      bool found_all = true;
      for_each_index(out.shape, [&](const Shape& i) {
        std::vector<Arr> values(terms);
        std::vector<bool> found(terms, false);
        for (int src : g) {
          const Shape cs = m.coord_of(src), so = s.from.global_offset(cs), ss = s.from.local_shape(cs);
          const int64_t q = term(cs);
          Shape j(i.size());
          bool inside = !found[q];
          for (size_t d = 0; d < i.size(); ++d) {
            j[d] = i[d] + off[d] - so[d];
            inside = inside && j[d] >= 0 && j[d] < ss[d];
          }
          if (!inside) continue;
          const Arr& a = locals[pos_of(m, src)];
          values[q] = {{}, {a.v[flat(a.shape, j)]}};
          found[q] = true;
        }
        for (bool f : found) found_all = found_all && f;
        if (!found_all) return;
        double x = reduce(values, kind).v[0];
        out.v[flat(out.shape, i)] = kind == hp::ReduceOp::Sum ? x / avg : x;
      });
      if (!found_all) return false;
    }
  }
  locals = std::move(next);
  return true;
}

// Applies `s` to every group along its mesh dim; false when it cannot be carried out.
inline bool apply(const hp::RedistributeStep& s, Locals& locals) {
  if (s.kind == hp::StepKind::FlattenedAllToAll) return apply_flattened(s, locals);
  const hp::MeshShape& m = s.from.mesh();
  const int64_t k = m.dim_size(s.mesh_dim);
  Locals next = locals;
  for (const auto& g : m.groups_along({s.mesh_dim})) {
    std::vector<Arr> in;
    for (int r : g) in.push_back(locals[pos_of(m, r)]);
    std::vector<Arr> out(k);
    for (int64_t j = 0; j < k; ++j) {
      switch (s.kind) {
        case hp::StepKind::AllGather: out[j] = concat(in, s.concat_dim); break;
        case hp::StepKind::AllReduce: out[j] = reduce(in, s.op); break;
        case hp::StepKind::ReduceScatter: out[j] = chunk(reduce(in, s.op), s.split_dim, k, j); break;
        case hp::StepKind::AllToAll: {
          std::vector<Arr> parts;
          for (int64_t i = 0; i < k; ++i) parts.push_back(chunk(in[i], s.split_dim, k, j));
          out[j] = concat(parts, s.concat_dim);
          break;
        }
        case hp::StepKind::LocalChunk: out[j] = chunk(in[j], s.split_dim, k, j); break;
        case hp::StepKind::LocalReduceToPartial:
          out[j] = (s.op == hp::ReduceOp::Sum && j != 0) ? zeros(in[j].shape) : in[j];
          break;
        case hp::StepKind::LocalScale:
          out[j] = in[j];
          for (double& x : out[j].v) x *= s.scale;
          break;
        case hp::StepKind::FlattenedAllToAll: break;  // above
      }
    }
    for (int64_t j = 0; j < k; ++j) next[pos_of(m, g[j])] = out[j];
  }
  locals = std::move(next);
  return true;
}

// Runs `plan` on `from`'s pieces of `global`, checking each step's before/after shapes.
inline ::testing::AssertionResult run(const hp::RedistributePlan& plan, const Arr& global,
                                      const hp::ShardSpec& from, const hp::ShardSpec& to) {
  Locals locals = distribute(global, from);
  hp::ShardSpec cur = from;
  for (const auto& s : plan.steps) {
    if (s.from != cur) return ::testing::AssertionFailure() << "step " << s.to_string() << " starts elsewhere";
    const hp::MeshShape& m = cur.mesh();
    for (int p = 0; p < m.size(); ++p)
      if (locals[p].shape != s.from.local_shape(m.coord_of(m.ranks()[p])))
        return ::testing::AssertionFailure() << "before " << s.to_string() << ": wrong local shape";
    if (!apply(s, locals)) return ::testing::AssertionFailure() << s.to_string() << " needs data from outside a group";
    auto ok = matches(locals, global, s.to);
    if (!ok) return ok << " after " << s.to_string();
    cur = s.to;
  }
  if (cur != to) return ::testing::AssertionFailure() << "plan ends at " << cur << ", not " << to;
  return matches(locals, global, to);
}

inline Arr iota(const Shape& s) {
  Arr a = zeros(s);
  for (size_t i = 0; i < a.v.size(); ++i) a.v[i] = static_cast<double>(i + 1);
  return a;
}

}  // namespace sim
