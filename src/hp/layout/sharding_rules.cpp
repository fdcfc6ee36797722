#include "hp/layout/sharding_rules.h"

#include <algorithm>
#include <sstream>

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp {
namespace {

using Shape = std::vector<int64_t>;

std::string shapes_string(const std::vector<Shape>& in) {
  std::string s;
  for (const auto& x : in) s += (s.empty() ? "" : " and ") + to_string_list(x);
  return s;
}

const char* kind_name(OpKind k) {
  switch (k) {
    case OpKind::Elementwise: return "elementwise";
    case OpKind::Add: return "add";
    case OpKind::Mul: return "mul";
    case OpKind::Matmul: return "matmul";
    case OpKind::Linear: return "linear";
    case OpKind::Sum: return "sum";
    case OpKind::Mean: return "mean";
    case OpKind::Softmax: return "softmax";
    case OpKind::Embedding: return "embedding";
    case OpKind::View: return "view";
    case OpKind::Transpose: return "transpose";
    case OpKind::Amax: return "amax";
    case OpKind::Permute: return "permute";
    case OpKind::Cat: return "cat";
    case OpKind::Narrow: return "narrow";
    case OpKind::Attention: return "attention";
  }
  return "?";
}

int norm_dim(const Op& op, int64_t d, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  HP_CHECK(d >= -r && d < r) << op.to_string() << ": dim " << d << " out of range for rank " << r;
  return static_cast<int>(d < 0 ? d + r : d);
}

Shape broadcast(const Op& op, const std::vector<Shape>& in) {
  size_t r = 0;
  for (const auto& s : in) r = std::max(r, s.size());
  Shape out(r, 1);
  for (const auto& s : in)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[r - s.size() + i];
      HP_CHECK(s[i] == o || s[i] == 1 || o == 1)
          << op.to_string() << ": shapes " << shapes_string(in) << " do not broadcast";
      if (o == 1) o = s[i];
    }
  return out;
}

std::vector<int> reduced_dims(const Op& op, size_t rank) {
  std::vector<int> d;
  for (int64_t x : op.dims) d.push_back(norm_dim(op, x, rank));
  std::sort(d.begin(), d.end());
  return d;
}

Shape view_shape(const Op& op, const Shape& in) {
  int64_t n = 1, known = 1;
  for (int64_t d : in) n *= d;
  Shape out = op.dims;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      HP_CHECK(infer < 0) << op.to_string() << ": more than one -1";
      infer = static_cast<int>(i);
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    HP_CHECK(known > 0 && n % known == 0) << op.to_string() << " cannot view " << to_string_list(in);
    out[infer] = n / known;
    known *= out[infer];
  }
  HP_CHECK(known == n) << op.to_string() << ": " << to_string_list(in) << " has " << n
                       << " elements, the new shape " << known;
  return out;
}

// Ops that only move or select elements commute with every pending reduction.
void add_passthrough_partials(std::vector<Signature>& sigs, size_t n) {
  for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    sigs.push_back({std::vector<Placement>(n, Partial(r)), Partial(r)});
}

// dims[j] names the input dim that becomes output dim j.
std::vector<int> permutation(const Op& op, size_t rank) {
  HP_CHECK(op.dims.size() == rank) << op.to_string() << ": needs " << rank << " dims";
  std::vector<int> p;
  for (int64_t d : op.dims) p.push_back(norm_dim(op, d, rank));
  std::vector<int> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < rank; ++i) HP_CHECK(sorted[i] == static_cast<int>(i)) << op.to_string() << " is not a permutation";
  return p;
}

void add_partials(std::vector<Signature>& sigs, size_t n, int which) {
  // which < 0: every input partial (add); else only input `which`, the rest replicated.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    std::vector<Placement> in(n, which < 0 ? Partial(op) : Replicate());
    if (which >= 0) in[which] = Partial(op);
    sigs.push_back({in, Partial(op)});
  }
}

}  // namespace

std::string Signature::to_string() const { return to_string_list(inputs, "", "") + " -> " + output.to_string(); }

int Op::arity() const {
  switch (kind) {
    case OpKind::Elementwise:
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Cat: return num_inputs;
    case OpKind::Attention: return 3;
    case OpKind::Matmul:
    case OpKind::Linear:
    case OpKind::Embedding: return 2;
    default: return 1;
  }
}

size_t Op::hash() const {
  size_t h = static_cast<size_t>(kind) * 31 + (flag ? 17 : 0) + static_cast<size_t>(num_inputs) * 131;
  for (int64_t d : dims) h = h * 1000003u ^ static_cast<size_t>(d + 1000);
  return h;
}

std::string Op::to_string() const {
  if (label) return label;
  std::ostringstream os;
  os << kind_name(kind);
  if (!dims.empty()) os << to_string_list(dims, "(", ")");
  if (flag) os << "[keepdim]";
  return os.str();
}

Shape output_shape(const Op& op, const std::vector<Shape>& in) {
  HP_CHECK(static_cast<int>(in.size()) == op.arity())
      << op.to_string() << " takes " << op.arity() << " inputs, found " << in.size();
  switch (op.kind) {
    case OpKind::Elementwise:
    case OpKind::Add:
    case OpKind::Mul: return broadcast(op, in);
    case OpKind::Matmul: {
      const Shape &a = in[0], &b = in[1];
      HP_CHECK(a.size() >= 2 && (b.size() == 2 || b.size() == a.size()) && a.back() == b[b.size() - 2] &&
               (b.size() == 2 || std::equal(a.begin(), a.end() - 2, b.begin())))
          << "matmul expects a[..., m, k] and b[k, n] or b[..., k, n] with a's batch dims; found "
          << to_string_list(a) << " and " << to_string_list(b);
      Shape out = a;
      out.back() = b.back();
      return out;
    }
    case OpKind::Linear: {
      const Shape &x = in[0], &w = in[1];
      HP_CHECK(!x.empty() && w.size() == 2 && x.back() == w[1])
          << "linear expects x[..., in] and weight[out, in]; found " << to_string_list(x) << " and "
          << to_string_list(w);
      Shape out = x;
      out.back() = w[0];
      return out;
    }
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::Amax: {
      std::vector<int> red = reduced_dims(op, in[0].size());
      Shape out;
      for (int i = 0; i < static_cast<int>(in[0].size()); ++i) {
        bool r = std::count(red.begin(), red.end(), i) > 0;
        if (!r) out.push_back(in[0][i]);
        else if (op.flag) out.push_back(1);
      }
      return out;
    }
    case OpKind::Softmax: norm_dim(op, op.dims.at(0), in[0].size()); return in[0];
    case OpKind::Embedding: {
      HP_CHECK(in[0].size() == 2) << "embedding expects table[V, D], found " << to_string_list(in[0]);
      Shape out = in[1];
      out.push_back(in[0][1]);
      return out;
    }
    case OpKind::View: return view_shape(op, in[0]);
    case OpKind::Transpose: {
      Shape out = in[0];
      std::swap(out[norm_dim(op, op.dims.at(0), out.size())], out[norm_dim(op, op.dims.at(1), out.size())]);
      return out;
    }
    case OpKind::Permute: {
      Shape out;
      for (int d : permutation(op, in[0].size())) out.push_back(in[0][d]);
      return out;
    }
    case OpKind::Cat: {
      HP_CHECK(!in.empty() && !in[0].empty()) << op.to_string() << " needs tensors of rank 1 or more";
      const int d = norm_dim(op, op.dims.at(0), in[0].size());
      Shape out = in[0];
      out[d] = 0;
      for (const auto& s : in) {
        bool fits = s.size() == out.size();
        for (size_t t = 0; fits && t < s.size(); ++t) fits = static_cast<int>(t) == d || s[t] == out[t];
        HP_CHECK(fits) << op.to_string() << ": shapes " << shapes_string(in) << " differ outside dim " << d;
        out[d] += s[d];
      }
      return out;
    }
    case OpKind::Narrow: {
      const int d = norm_dim(op, op.dims.at(0), in[0].size());
      const int64_t start = op.dims.at(1), length = op.dims.at(2);
      HP_CHECK(start >= 0 && length >= 0 && start + length <= in[0][d])
          << op.to_string() << ": [" << start << ", " << start + length << ") outside dim " << d << " of "
          << to_string_list(in[0]);
      Shape out = in[0];
      out[d] = length;
      return out;
    }
    case OpKind::Attention: {
      const Shape &q = in[0], &k = in[1], &v = in[2];
      HP_CHECK(q.size() == 4 && k.size() == 4 && v.size() == 4 && k[0] == q[0] && v[0] == q[0] && k[1] == v[1] &&
               k[1] > 0 && q[1] % k[1] == 0 && k[2] == v[2] && k[3] == q[3])
          << "attention expects q[B, Hq, Sq, D], k[B, Hkv, Sk, D], v[B, Hkv, Sk, Dv] with Hq a multiple of Hkv; "
          << "found " << shapes_string(in);
      return {q[0], q[1], q[2], v[3]};
    }
  }
  return {};
}

std::vector<Signature> signatures(const Op& op, const std::vector<Shape>& in, int64_t mesh_size) {
  const Shape out = output_shape(op, in);
  const size_t n = in.size();
  std::vector<Signature> sigs{{std::vector<Placement>(n, Replicate()), Replicate()}};
  auto even = [&](int64_t size) { return size % mesh_size == 0; };

  switch (op.kind) {
    case OpKind::Elementwise:
    case OpKind::Add:
    case OpKind::Mul: {
      const size_t r = out.size();
      for (size_t d = 0; d < r; ++d) {
        Signature s{{}, Shard(static_cast<int>(d))};
        for (const auto& shape : in) {
          // Broadcast inputs (missing dim or size 1 against a larger one) stay whole.
          int64_t j = static_cast<int64_t>(d) - static_cast<int64_t>(r - shape.size());
          bool whole = j < 0 || (shape[j] == 1 && out[d] != 1);
          s.inputs.push_back(whole ? Replicate() : Shard(static_cast<int>(j)));
        }
        sigs.push_back(s);
      }
      if (op.kind == OpKind::Add) add_partials(sigs, n, -1);
      if (op.kind == OpKind::Mul)
        for (size_t i = 0; i < n; ++i) add_partials(sigs, n, static_cast<int>(i));
      break;
    }
    case OpKind::Matmul: {
      const int ra = static_cast<int>(in[0].size()), rb = static_cast<int>(in[1].size());
      for (int t = 0; t < ra - 2; ++t) sigs.push_back({{Shard(t), rb == 2 ? Replicate() : Shard(t)}, Shard(t)});
      sigs.push_back({{Shard(ra - 2), Replicate()}, Shard(ra - 2)});   // rows of a
      sigs.push_back({{Replicate(), Shard(rb - 1)}, Shard(ra - 1)});   // columns of b
      sigs.push_back({{Shard(ra - 1), Shard(rb - 2)}, Partial()});     // contracted dim
      add_partials(sigs, 2, 0);
      add_partials(sigs, 2, 1);
      break;
    }
    case OpKind::Linear: {
      const int rx = static_cast<int>(in[0].size());
      for (int t = 0; t < rx - 1; ++t) sigs.push_back({{Shard(t), Replicate()}, Shard(t)});
      sigs.push_back({{Replicate(), Shard(0)}, Shard(rx - 1)});  // column parallel
      sigs.push_back({{Shard(rx - 1), Shard(1)}, Partial()});    // row parallel
      add_partials(sigs, 2, 0);
      add_partials(sigs, 2, 1);
      break;
    }
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::Amax: {
      std::vector<int> red = reduced_dims(op, in[0].size());
      for (int t = 0; t < static_cast<int>(in[0].size()); ++t) {
        if (std::count(red.begin(), red.end(), t)) {
          // Partial sums add up; partial means average up only over equal pieces.
          if (op.kind == OpKind::Sum) sigs.push_back({{Shard(t)}, Partial(ReduceOp::Sum)});
          else if (op.kind == OpKind::Amax) sigs.push_back({{Shard(t)}, Partial(ReduceOp::Max)});
          else if (even(in[0][t])) sigs.push_back({{Shard(t)}, Partial(ReduceOp::Avg)});
        } else {
          int before = static_cast<int>(std::count_if(red.begin(), red.end(), [&](int x) { return x < t; }));
          sigs.push_back({{Shard(t)}, Shard(op.flag ? t : t - before)});
        }
      }
      // A max of partial terms is not the max of their reduction: those are settled first.
      if (op.kind != OpKind::Amax) add_partials(sigs, 1, 0);
      break;
    }
    case OpKind::Softmax: {
      const int d = norm_dim(op, op.dims[0], in[0].size());
      for (int t = 0; t < static_cast<int>(in[0].size()); ++t)
        if (t != d) sigs.push_back({{Shard(t)}, Shard(t)});
      break;
    }
    case OpKind::Embedding: {
      const int ri = static_cast<int>(in[1].size());
      for (int t = 0; t < ri; ++t) sigs.push_back({{Replicate(), Shard(t)}, Shard(t)});
      sigs.push_back({{Shard(1), Replicate()}, Shard(ri)});  // embedding columns
      sigs.push_back({{Shard(0), Replicate()}, Partial()});  // vocab rows: masked lookup
      add_partials(sigs, 2, 0);
      break;
    }
    case OpKind::Transpose: {
      const int a = norm_dim(op, op.dims[0], in[0].size()), b = norm_dim(op, op.dims[1], in[0].size());
      for (int t = 0; t < static_cast<int>(in[0].size()); ++t)
        sigs.push_back({{Shard(t)}, Shard(t == a ? b : t == b ? a : t)});
      add_passthrough_partials(sigs, 1);
      break;
    }
    case OpKind::View: {
      // Split both shapes into segments of equal element count; the first dim of a segment
      // may stay sharded when both sides split it evenly (a lone, unchanged dim always can).
      const Shape& s = in[0];
      size_t i = 0, j = 0;
      int64_t numel = 1;
      for (int64_t d : s) numel *= d;
      while (numel > 0 && (i < s.size() || j < out.size())) {
        const size_t si = i, sj = j;
        int64_t pi = i < s.size() ? s[i++] : 1, pj = j < out.size() ? out[j++] : 1;
        while (pi != pj) {
          if (pi < pj && i < s.size()) pi *= s[i++];
          else if (j < out.size()) pj *= out[j++];
          else break;
        }
        if (si == i || sj == j) continue;
        const bool same = i - si == 1 && j - sj == 1;
        if (same || (even(s[si]) && even(out[sj])))
          sigs.push_back({{Shard(static_cast<int>(si))}, Shard(static_cast<int>(sj))});
      }
      add_passthrough_partials(sigs, 1);
      break;
    }
    case OpKind::Permute: {
      const std::vector<int> p = permutation(op, in[0].size());
      for (int j = 0; j < static_cast<int>(p.size()); ++j) sigs.push_back({{Shard(p[j])}, Shard(j)});
      add_passthrough_partials(sigs, 1);
      break;
    }
    case OpKind::Cat:
    case OpKind::Narrow: {
      // Shards of other dims line up (equal sizes there); a shard of `dim` is gathered.
      const int d = norm_dim(op, op.dims[0], in[0].size());
      for (int t = 0; t < static_cast<int>(in[0].size()); ++t)
        if (t != d) sigs.push_back({std::vector<Placement>(n, Shard(t)), Shard(t)});
      add_passthrough_partials(sigs, n);
      break;
    }
    case OpKind::Attention: {
      sigs.push_back({{Shard(0), Shard(0), Shard(0)}, Shard(0)});  // batch
      // Heads: each rank's query heads must read its own kv heads, which an even split
      // of both gives.
      if (even(in[0][1]) && even(in[1][1])) sigs.push_back({{Shard(1), Shard(1), Shard(1)}, Shard(1)});
      sigs.push_back({{Shard(2), Replicate(), Replicate()}, Shard(2)});  // query positions
      break;
    }
  }
  return sigs;
}

}  // namespace hp
