// Op sharding signatures, OneFlow style: for one mesh dim, a Signature says which input
// placements an op accepts and the output placement it then produces. An n-D layout picks
// one signature per mesh dim. Rules need only shapes, so they stay torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hp/layout/placement.h"

namespace hp {

struct Signature {
  std::vector<Placement> inputs;
  Placement output;
  bool operator==(const Signature& o) const { return inputs == o.inputs && output == o.output; }
  std::string to_string() const;  // "S(0), R -> S(0)"
};

enum class OpKind {
  Elementwise,  // any elementwise op with broadcasting; no Partial passes through
  Add,          // elementwise and linear in every input: all P(sum) -> P(sum)
  Mul,          // elementwise and linear in each input: one P(sum), rest R -> P(sum)
  Matmul,       // a[..., m, k] @ b[k, n] or b[..., k, n] with a's batch dims
  Linear,       // x[..., in] with weight[out, in] -> x @ weight^T
  Sum,          // over `dims`, keepdim in `flag`
  Mean,
  Softmax,      // along dims[0]
  Embedding,    // table[V, D], ids[...] -> [..., D]; a vocab-sharded table gives P(sum)
                // (the local lookup must zero ids outside its rows)
  View,         // to shape `dims` (one -1 allowed)
  Transpose,    // swaps dims[0] and dims[1]
  Amax,         // max over `dims`, keepdim in `flag`; a sharded reduced dim gives P(max)
  Permute,      // output dim j is input dim dims[j]
  Cat,          // num_inputs tensors joined along dims[0]
  Narrow,       // dims = {dim, start, length}
  Attention,    // q[B, Hq, Sq, D], k[B, Hkv, Sk, D], v[B, Hkv, Sk, Dv] -> [B, Hq, Sq, Dv]
                // (Hq a multiple of Hkv); queries may be split by position, keys not
};

struct Op {
  OpKind kind;
  std::vector<int64_t> dims;  // op arguments as described above
  bool flag = false;
  int num_inputs = 1;         // Elementwise, Add, Mul, Cat
  // A function that runs under another op's rule (rms_norm under mul's) goes by its own
  // name in errors and to activation checkpointing's policies; not part of the rule.
  const char* label = nullptr;

  static Op elementwise(int num_inputs = 1) { return {OpKind::Elementwise, {}, false, num_inputs}; }
  static Op add() { return {OpKind::Add, {}, false, 2}; }
  static Op mul() { return {OpKind::Mul, {}, false, 2}; }
  static Op matmul() { return {OpKind::Matmul, {}, false, 2}; }
  static Op linear() { return {OpKind::Linear, {}, false, 2}; }
  static Op sum(std::vector<int64_t> dims, bool keepdim = false) { return {OpKind::Sum, std::move(dims), keepdim, 1}; }
  static Op mean(std::vector<int64_t> dims, bool keepdim = false) { return {OpKind::Mean, std::move(dims), keepdim, 1}; }
  static Op softmax(int64_t dim) { return {OpKind::Softmax, {dim}, false, 1}; }
  static Op embedding() { return {OpKind::Embedding, {}, false, 2}; }
  static Op view(std::vector<int64_t> shape) { return {OpKind::View, std::move(shape), false, 1}; }
  static Op transpose(int64_t a, int64_t b) { return {OpKind::Transpose, {a, b}, false, 1}; }
  static Op amax(std::vector<int64_t> dims, bool keepdim = false) { return {OpKind::Amax, std::move(dims), keepdim, 1}; }
  static Op permute(std::vector<int64_t> dims) { return {OpKind::Permute, std::move(dims), false, 1}; }
  static Op cat(int64_t dim, int num_inputs) { return {OpKind::Cat, {dim}, false, num_inputs}; }
  static Op narrow(int64_t dim, int64_t start, int64_t length) { return {OpKind::Narrow, {dim, start, length}, false, 1}; }
  static Op attention() { return {OpKind::Attention, {}, false, 3}; }
  Op named(const char* name) const {
    Op o = *this;
    o.label = name;
    return o;
  }

  int arity() const;
  bool operator==(const Op& o) const {
    return kind == o.kind && dims == o.dims && flag == o.flag && num_inputs == o.num_inputs;
  }
  size_t hash() const;
  std::string to_string() const;
};

// Output shape, checking the inputs' shapes (errors name the op and the shapes).
std::vector<int64_t> output_shape(const Op& op, const std::vector<std::vector<int64_t>>& input_shapes);

// The signatures of one mesh dim, most preferred first. `mesh_size` (all ranks) guards
// rules that are exact only for even splits (mean over a sharded dim, view).
std::vector<Signature> signatures(const Op& op, const std::vector<std::vector<int64_t>>& input_shapes,
                                  int64_t mesh_size);

}  // namespace hp
