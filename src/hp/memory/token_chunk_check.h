// Whether a full region may be recomputed in token chunks (CheckpointOptions::token_chunks):
// it must treat each row of its input alone. This observer follows the input's rows
// through the hp ops of the region's forward and finds the first op that combines rows:
// one that reduces, moves or contracts a row dimension, reads another row of the same
// sequence by position (attention, rotary), exchanges tokens between ranks, or is a linear
// op with another kernel than at::linear (FP8's, whose scales span rows).
//
// A row is a token: every dimension of the input but the last. A tensor made from the
// input carries the same rows when a prefix of its dimensions multiplies to their number
// ([batch, seq, heads, head_dim] for an input [batch, seq, dim]); an op keeps the rows
// apart when every tensor it reads from the input and its output carry them and it touches
// only the dimensions after that prefix. The same holds one level up, for sequences (the
// input's first dimension, of three or more): attention keeps sequences apart though not
// tokens, so such a region is split into whole sequences. An op that mixes sequences is an
// error.
//
// Only hp's observed ops are seen: code that runs plain LibTorch ops on local tensors
// inside the region (a MoE layer's token dispatch) is not, and its output is taken as not
// made from the rows; a region whose output no observed op made from its input is an error.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "hp/memory/storage_map.h"
#include "hp/tensor/op_observer.h"

namespace hp::memory {

class TokenChunkCheck : public OpObserver {
 public:
  // Watches this thread's ops until destroyed, passing each on to the observer before it.
  explicit TokenChunkCheck(const at::Tensor& input);
  ~TokenChunkCheck() override;
  TokenChunkCheck(const TokenChunkCheck&) = delete;
  TokenChunkCheck& operator=(const TokenChunkCheck&) = delete;

  at::Tensor run(const ObservedOp& op, const std::function<at::Tensor()>& compute) override;

  // After the forward: whether chunks may split a sequence's tokens (else only whole
  // sequences). Throws, naming the op, where the region mixes sequences or its output is
  // not made from its input's rows.
  bool tokens_apart(const at::Tensor& output) const;

 private:
  // Whether `op`, reading `derived` (1 where the input is made from the rows) and giving
  // `out`, keeps groups of `group` elements' worth of leading rows apart.
  bool keeps_apart(const ObservedOp& op, const std::vector<at::Tensor>& inputs, const std::vector<bool>& derived,
                   const at::Tensor& out, int64_t group) const;
  bool derived(const at::Tensor& t) const;

  int64_t tokens_ = 0;     // rows of the input
  int64_t sequences_ = 0;  // its first dimension; 0 for an input of fewer than three
  StorageMap<bool> rows_;  // storages made from the input's rows
  std::string mixes_tokens_, mixes_sequences_;  // the first op that does
  OpObserver* outer_;
  std::unique_ptr<ScopedOpObserver> scope_;
};

}  // namespace hp::memory
