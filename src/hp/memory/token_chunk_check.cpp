#include "hp/memory/token_chunk_check.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/tensor/ops.h"

namespace hp::memory {
namespace {

// The number of leading dimensions of `t` whose sizes multiply to `group`; -1 if none do.
int prefix(const at::Tensor& t, int64_t group) {
  int64_t n = 1;
  for (int d = 0; d < t.dim(); ++d) {
    n *= t.size(d);
    if (n == group) return d + 1;
    if (n > group) return -1;
  }
  return -1;
}

int64_t wrap(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

// The dimensions of input `i` (of rank `rank`) whose elements `op` combines or moves.
std::vector<int64_t> touched(const ObservedOp& op, size_t i, int64_t rank, bool b_derived, const at::Tensor& in,
                             const at::Tensor& out) {
  std::vector<int64_t> all;
  for (int64_t d = 0; d < rank; ++d) all.push_back(d);
  if (!op.op) {  // a redistribution: the dimensions whose local size it changes
    if (!out.defined() || out.dim() != rank) return all;
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank; ++d)
      if (in.size(d) != out.size(d)) dims.push_back(d);
    return dims;
  }
  const std::vector<int64_t> past_batch(all.begin() + std::min<int64_t>(1, rank), all.end());
  // Rotary reads each token's position in its sequence; attention, every key of the sequence.
  if (op.op->label && std::string(op.op->label) == "rotary") return past_batch;
  const std::vector<int64_t>& dims = op.op->dims;
  switch (op.op->kind) {
    case OpKind::Elementwise:
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Embedding:
    case OpKind::View:
      return {};
    case OpKind::Linear:  // at::linear treats rows alone; FP8's scales span rows (tensorwise, or dW's contraction)
      return op.op->label == kAtLinearLabel ? std::vector<int64_t>{rank - 1} : all;
    case OpKind::Matmul:
      if (i == 0) return b_derived ? std::vector<int64_t>{rank - 2, rank - 1} : std::vector<int64_t>{rank - 1};
      return {rank - 2, rank - 1};
    case OpKind::Sum:
    case OpKind::Mean:
    case OpKind::Amax: {
      if (dims.empty()) return all;
      std::vector<int64_t> r;
      for (int64_t d : dims) r.push_back(wrap(d, rank));
      return r;
    }
    case OpKind::Softmax:
    case OpKind::Narrow:
    case OpKind::Cat:
      return {wrap(dims.at(0), rank)};
    case OpKind::Transpose:
      return {wrap(dims.at(0), rank), wrap(dims.at(1), rank)};
    case OpKind::Permute: {
      std::vector<int64_t> r;
      for (size_t j = 0; j < dims.size(); ++j)
        if (wrap(dims[j], rank) != static_cast<int64_t>(j)) r.push_back(wrap(dims[j], rank));
      return r;
    }
    case OpKind::Attention:
      return past_batch;
  }
  return all;
}

bool broadcasts(const ObservedOp& op) {
  return op.op && (op.op->kind == OpKind::Elementwise || op.op->kind == OpKind::Add || op.op->kind == OpKind::Mul);
}

}  // namespace

TokenChunkCheck::TokenChunkCheck(const at::Tensor& input) : outer_(op_observer()) {
  HP_CHECK(input.dim() >= 2) << "checkpoint: token_chunks splits a region's rows, and its input has "
                             << input.dim() << " dimension(s)";
  tokens_ = input.numel() / std::max<int64_t>(input.size(input.dim() - 1), 1);
  sequences_ = input.dim() >= 3 ? input.size(0) : 0;
  rows_.insert(input, true);
  scope_ = std::make_unique<ScopedOpObserver>(this);
}

TokenChunkCheck::~TokenChunkCheck() = default;

bool TokenChunkCheck::derived(const at::Tensor& t) const { return rows_.find(t) != nullptr; }

bool TokenChunkCheck::keeps_apart(const ObservedOp& op, const std::vector<at::Tensor>& inputs,
                                  const std::vector<bool>& from_rows, const at::Tensor& out, int64_t group) const {
  const int at_out = out.defined() ? prefix(out, group) : 0;
  if (at_out < 0) return false;
  const bool b_derived = inputs.size() > 1 && from_rows[1];
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!from_rows[i]) {
      // A table added or multiplied in by position (a mask, a positional encoding) makes a
      // row depend on where it sits: it may not vary along the output's rows.
      if (!broadcasts(op) || !out.defined()) continue;
      const int64_t shift = out.dim() - t.dim();
      for (int64_t d = 0; d < t.dim(); ++d)
        if (shift + d < at_out && t.size(d) > 1) return false;
      continue;
    }
    const int at_in = prefix(t, group);
    if (at_in < 0) return false;
    for (int64_t d : touched(op, i, t.dim(), b_derived, t, out))
      if (d < at_in) return false;
  }
  return true;
}

at::Tensor TokenChunkCheck::run(const ObservedOp& op, const std::function<at::Tensor()>& compute) {
  at::Tensor out = outer_ ? outer_->run(op, compute) : compute();
  if (!op.inputs) return out;
  std::vector<bool> from_rows;
  bool any = false;
  for (const at::Tensor& t : *op.inputs) {
    from_rows.push_back(derived(t));
    any = any || from_rows.back();
  }
  if (!any) return out;
  rows_.insert(out, true);
  const std::string name = op.name();
  if (op.collective) {  // tokens exchanged between ranks (a MoE dispatch)
    if (mixes_sequences_.empty()) mixes_sequences_ = name;
  } else if (!keeps_apart(op, *op.inputs, from_rows, out, tokens_)) {
    if (sequences_ > 0 && keeps_apart(op, *op.inputs, from_rows, out, sequences_)) {
      if (mixes_tokens_.empty()) mixes_tokens_ = name;
    } else if (mixes_sequences_.empty()) {
      mixes_sequences_ = name;
    }
  }
  return out;
}

bool TokenChunkCheck::tokens_apart(const at::Tensor& output) const {
  HP_CHECK(mixes_sequences_.empty())
      << "checkpoint: token_chunks recomputes a region's rows in chunks, and its op " << mixes_sequences_
      << " combines rows of different " << (sequences_ > 0 ? "sequences" : "tokens")
      << ", so a chunk would not give the whole region's values; checkpoint it whole (token_chunks = 1)";
  HP_CHECK(derived(output))
      << "checkpoint: token_chunks recomputes a region's rows in chunks, and its output does not come from its input "
      << "through hp's DTensor ops (code on local tensors, such as a MoE layer's token dispatch, cannot be seen to "
      << "keep rows apart); checkpoint it whole (token_chunks = 1)";
  return mixes_tokens_.empty();
}

}  // namespace hp::memory
