// One parameter under fully_shard: the sharded DTensor the module holds between steps
// (what the optimizer, clipping and checkpoints see) and the unsharded local tensor that
// forward and backward use, with the copies between them and a unit's flat buffers.
//
// The parameter is split along one tensor dim over the shard mesh dims (one, or several
// flattened into one group). That dim is one no inner mesh dim shards, so that the
// unsharded tensor is the concatenation of the shard ranks' pieces (with tensor
// parallelism on a (dp, tp) mesh: dim 1 of a column-parallel weight, dim 0 of a row-
// parallel one). Uneven sizes follow ShardSpec's chunks.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "hp/memory/storage_tier.h"
#include "hp/tensor/dtensor.h"

namespace hp::parallel {

class FSDPParam {
 public:
  // `slot` holds a parameter replicated on `shard_dims` (and on `replicate_dim`, HSDP,
  // when >= 0); it is replaced by the sharded parameter. `shard_ranks`: the global ranks
  // of the shard group, in the order of its gathered rows.
  FSDPParam(std::string name, DTensor* slot, const std::vector<int>& shard_dims, const std::vector<int>& shard_ranks,
            int replicate_dim, at::ScalarType compute_dtype);

  const std::string& name() const { return name_; }
  // Made inside nn::no_init_parameters(): its shard has storage, not values, until
  // nn::init_parameters fills it.
  bool deferred() const { return deferred_; }
  DTensor* slot() const { return slot_; }  // the module's parameter
  const DTensor& sharded() const { return sharded_; }
  int64_t padded_numel() const { return padded_numel_; }  // one rank's slot in a flat buffer
  int64_t unsharded_bytes() const;                         // 0 while resharded

  // The module sees the unsharded parameter (an alias of its storage whose gradient flows
  // to `grad_fn_output`) during the unit's forward, the sharded one otherwise.
  void show_unsharded(const at::Tensor& local_alias);
  void show_sharded() { *slot_ = sharded_; }
  // A fresh tensor over the unsharded storage (not a view: autograd sees a new tensor).
  at::Tensor unsharded_alias() const;

  // All-gather: this rank's shard into its slot [padded_numel] of the send buffer; every
  // rank's slot, `rows` [shard ranks, padded_numel], back into the unsharded tensor
  // (allocating its storage if it was freed). With a scale (FP8 all-gather), the slots
  // hold E4M3: the shard is cast with it and the pieces dequantized with it.
  void pack_shard(at::Tensor slot, const at::Tensor& scale = {}) const;
  void unpack_gathered(const at::Tensor& rows, const at::Tensor& scale = {});
  void free_unsharded();
  // The unsharded tensor's storage (the same one after every gather) and layout.
  const c10::Storage& unsharded_storage() const { return unsharded_.storage(); }
  const ShardSpec& unsharded_spec() const { return unsharded_spec_; }

  // Reduce-scatter: rank r's piece of the unsharded gradient into row r of `send`; the
  // reduced piece back, added to the sharded parameter's gradient.
  void pack_grad(const at::Tensor& grad, at::Tensor send, int64_t offset) const;
  void accumulate_grad(const at::Tensor& reduced, int64_t offset);

  // Offload (fully_shard's offload policy): between uses the shard and its gradient live in
  // `tier` under key.param and key.grad, their storage released (the tensors keep their
  // shapes). The gradient is written as accumulate_grad leaves it.
  void offload_to(std::shared_ptr<memory::StorageTier> tier, std::string key);
  bool offloaded() const { return tier_ != nullptr; }
  // Reads the shard (and with `grad` its gradient) back if it is out. `changing`: the caller
  // may change them, so send_out() writes them back.
  void bring_in(bool grad, bool changing);
  // The gradient alone (clipping reads it, then scales it).
  void bring_in_grad(bool changing);
  void send_out();  // writes what may have changed, then releases the memory

 private:
  void load_shard();
  void load_grad();
  struct Piece {
    int64_t offset, size;  // along dim_, within the unsharded local tensor
    std::vector<int64_t> shape;
  };
  std::string name_;
  DTensor* slot_;
  bool deferred_ = false;
  int dim_;  // the tensor dim split over the shard mesh dim
  int shard_rank_;
  std::vector<Piece> pieces_;  // per shard rank
  int64_t padded_numel_;
  DTensor sharded_;
  ShardSpec unsharded_spec_;
  std::vector<int> reduce_dims_;
  at::Tensor unsharded_;  // its storage is freed when resharded
  size_t unsharded_nbytes_;
  std::shared_ptr<memory::StorageTier> tier_;  // null: not offloaded
  std::string key_;
  bool shard_out_ = false, grad_out_ = false;      // in the tier, storage released
  bool shard_dirty_ = false, grad_dirty_ = false;  // brought in by someone who may change it
};

}  // namespace hp::parallel
