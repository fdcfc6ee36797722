#include "hp/parallel/fsdp_param.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/nn/module.h"
#include "hp/tensor/fp8_quantize.h"

namespace hp::parallel {
namespace {

// The tensor dim to split: the first one that only mesh dims outer to the shard dims
// split (the shard dims then split the piece they gave: ShardSpec nests mesh dims outer
// to inner), preferring a dim with at least one element per shard rank.
int choose_dim(const ShardSpec& spec, const std::vector<int>& shard_dims, int64_t shards, const std::string& name) {
  const int shard_dim = shard_dims.empty() ? spec.ndim() : shard_dims.front();
  int fallback = -1;
  for (int d = 0; d < spec.ndim(); ++d) {
    bool free = true;
    for (int k : spec.mesh_dims_sharding(d)) free = free && k < shard_dim;
    if (!free) continue;
    if (spec.shape()[d] >= shards) return d;
    if (fallback < 0) fallback = d;
  }
  HP_CHECK(fallback >= 0) << "fully_shard: parameter '" << name << "' " << spec.to_string()
                          << " has no dim left to shard on mesh dim " << shard_dim
                          << " (every dim is split by a mesh dim inner to it)";
  return fallback;
}

// Gives a tensor's storage back to its allocator, or allocates it again at its size.
void release(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }
void restore(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = (t.storage_offset() + t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

}  // namespace

FSDPParam::FSDPParam(std::string name, DTensor* slot, const std::vector<int>& shard_dims,
                     const std::vector<int>& shard_ranks, int replicate_dim, at::ScalarType compute_dtype)
    : name_(std::move(name)), slot_(slot), sharded_(*slot), unsharded_spec_(slot->spec()) {
  const DTensor full = *slot;  // a copy: the slot is overwritten below
  const DeviceMesh& mesh = full.device_mesh();
  std::vector<int> replicated = shard_dims;
  if (replicate_dim >= 0) replicated.push_back(replicate_dim);
  for (int k : replicated)
    HP_CHECK(full.placements()[k].is_replicate())
        << "fully_shard: parameter '" << name_ << "' " << full.spec().to_string() << " must be replicated on mesh dim "
        << mesh.dim_names()[k] << " to be sharded over it";
  HP_CHECK(full.dim() > 0) << "fully_shard: parameter '" << name_ << "' is a scalar";
  const int64_t shards = static_cast<int64_t>(shard_ranks.size());
  dim_ = choose_dim(full.spec(), shard_dims, shards, name_);
  std::vector<Placement> placements = full.placements();
  for (int k : shard_dims) placements[k] = Shard(dim_);
  ShardSpec spec = full.spec().with_placements(placements);

  // Each shard rank's piece, relative to the unsharded local tensor of this rank.
  const std::vector<int64_t> coord = mesh.coordinate();
  shard_rank_ = static_cast<int>(std::find(shard_ranks.begin(), shard_ranks.end(), mesh.rank()) - shard_ranks.begin());
  const int64_t base = full.spec().global_offset(coord)[dim_];
  padded_numel_ = 0;
  for (int r : shard_ranks) {
    const std::vector<int64_t> where = mesh.shape().coord_of(r);
    Piece p{spec.global_offset(where)[dim_] - base, 0, spec.local_shape(where)};
    p.size = p.shape[dim_];
    int64_t numel = 1;
    for (int64_t s : p.shape) numel *= s;
    padded_numel_ = std::max(padded_numel_, numel);
    pieces_.push_back(std::move(p));
  }
  const Piece& mine = pieces_[shard_rank_];
  // A deferred parameter (nn::no_init_parameters) gets storage of its shard's size only,
  // for nn::init_parameters to fill.
  const at::Tensor whole = full.to_local();
  deferred_ = awaits_init(full);
  const at::TensorOptions options = deferred_ ? tensor_options(mesh, whole.scalar_type()) : whole.options();
  at::Tensor local = deferred_ ? at::empty(mine.shape, options)
                               : whole.detach().narrow(dim_, mine.offset, mine.size).clone();
  sharded_ = nn::make_parameter(DTensor(local, mesh, spec));
  *slot_ = sharded_;

  reduce_dims_ = replicated;
  unsharded_spec_ = make_spec(full.sizes(), compute_dtype, mesh, full.placements());
  unsharded_ = at::empty(whole.sizes(), options.dtype(compute_dtype));
  unsharded_nbytes_ = unsharded_.storage().nbytes();
  free_unsharded();
}

int64_t FSDPParam::unsharded_bytes() const { return static_cast<int64_t>(unsharded_.storage().nbytes()); }

at::Tensor FSDPParam::unsharded_alias() const {
  return at::empty({0}, unsharded_.options()).set_(unsharded_.storage(), 0, unsharded_.sizes(), unsharded_.strides());
}

void FSDPParam::show_unsharded(const at::Tensor& local_alias) {
  DTensor p(local_alias, sharded_.device_mesh(), unsharded_spec_);
  p.defer_grad_reduction(reduce_dims_);
  *slot_ = p;
}

void FSDPParam::pack_shard(at::Tensor slot, const at::Tensor& scale) const {
  const at::Tensor local = sharded_.to_local().detach();
  slot.narrow(0, 0, local.numel()).view(local.sizes()).copy_(scale.defined() ? fp8_cast(local, scale, Fp8Format::E4M3).data
                                                                            : local);
}

void FSDPParam::unpack_gathered(const at::Tensor& rows, const at::Tensor& scale) {
  c10::StorageImpl* storage = unsharded_.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == 0) {
    storage->set_data_ptr_noswap(storage->allocator()->allocate(unsharded_nbytes_));
    storage->set_nbytes(unsharded_nbytes_);
  }
  // variable_data(): a fresh version counter, so refilling storage that backward has saved
  // does not look like an in-place change of a saved tensor.
  at::Tensor dst = unsharded_.variable_data();
  for (size_t r = 0; r < pieces_.size(); ++r) {
    const Piece& p = pieces_[r];
    if (p.size == 0) continue;
    int64_t numel = 1;
    for (int64_t s : p.shape) numel *= s;
    const at::Tensor piece = rows[r].narrow(0, 0, numel).view(p.shape);
    dst.narrow(dim_, p.offset, p.size).copy_(scale.defined() ? fp8_dequantize(piece, scale) : piece);
  }
}

void FSDPParam::free_unsharded() { unsharded_.storage().unsafeGetStorageImpl()->reset(); }

void FSDPParam::pack_grad(const at::Tensor& grad, at::Tensor send, int64_t offset) const {
  for (size_t r = 0; r < pieces_.size(); ++r) {
    const Piece& p = pieces_[r];
    if (p.size == 0) continue;
    int64_t numel = 1;
    for (int64_t s : p.shape) numel *= s;
    send[r].narrow(0, offset, numel).view(p.shape).copy_(grad.narrow(dim_, p.offset, p.size));
  }
}

void FSDPParam::accumulate_grad(const at::Tensor& reduced, int64_t offset) {
  at::Tensor local = sharded_.to_local();
  at::Tensor g = reduced.narrow(0, offset, local.numel()).view(local.sizes()).to(local.scalar_type());
  if (tier_) load_grad();
  at::Tensor& grad = local.mutable_grad();
  if (grad.defined())
    grad.add_(g);
  else
    grad = g.clone();  // its own storage: `reduced` is the collective's buffer
  if (!tier_) return;
  grad_dirty_ = true;  // kept, and written again by send_out(), if this write fails
  tier_->write(key_ + ".grad", grad);
  release(grad);
  grad_out_ = true, grad_dirty_ = false;
}

void FSDPParam::offload_to(std::shared_ptr<memory::StorageTier> tier, std::string key) {
  tier_ = std::move(tier);
  key_ = std::move(key);
  shard_dirty_ = true;
  send_out();
}

void FSDPParam::bring_in(bool grad, bool changing) {
  load_shard();
  shard_dirty_ = shard_dirty_ || changing;
  if (grad) bring_in_grad(changing);
}

void FSDPParam::bring_in_grad(bool changing) {
  load_grad();
  grad_dirty_ = grad_dirty_ || changing;
}

void FSDPParam::load_shard() {
  if (!shard_out_) return;
  at::Tensor local = sharded_.to_local();
  restore(local);
  tier_->read(key_ + ".param", local);
  shard_out_ = false;
}

// zero_grad() drops the gradient: then its file is stale and stays unread.
void FSDPParam::load_grad() {
  at::Tensor g = sharded_.to_local().grad();
  if (!g.defined()) grad_out_ = false;
  if (!grad_out_) return;
  restore(g);
  tier_->read(key_ + ".grad", g);
  grad_out_ = false;
}

void FSDPParam::send_out() {
  at::Tensor local = sharded_.to_local();
  if (!shard_out_) {
    if (shard_dirty_) tier_->write(key_ + ".param", local);
    release(local);
    shard_out_ = true, shard_dirty_ = false;
  }
  at::Tensor g = local.grad();
  if (g.defined() && !grad_out_) {
    if (grad_dirty_) tier_->write(key_ + ".grad", g);
    release(g);
    grad_out_ = true, grad_dirty_ = false;
  }
}

}  // namespace hp::parallel
