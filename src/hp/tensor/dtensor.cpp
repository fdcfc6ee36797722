#include "hp/tensor/dtensor.h"

#include <ATen/ATen.h>

#include <sstream>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/collectives.h"
#include "hp/tensor/redistribute.h"

namespace hp {

ShardSpec make_spec(const std::vector<int64_t>& shape, at::ScalarType dtype, const DeviceMesh& mesh,
                    std::vector<Placement> placements) {
  HP_CHECK(static_cast<int>(placements.size()) == mesh.ndim())
      << "placements " << to_string_list(placements) << " give " << placements.size()
      << " entries for a mesh of " << mesh.ndim() << " dims " << mesh.to_string();
  return ShardSpec(shape, static_cast<int64_t>(c10::elementSize(dtype)), mesh.shape(), std::move(placements));
}

DTensor::DTensor(at::Tensor local, DeviceMesh mesh, ShardSpec spec)
    : local_(std::move(local)), mesh_(std::move(mesh)), spec_(std::move(spec)) {
  HP_CHECK(local_.defined()) << "a DTensor needs a defined local tensor";
  HP_CHECK(spec_.mesh() == mesh_.shape())
      << "spec " << spec_.to_string() << " is for another mesh than " << mesh_.to_string();
  if (mesh_.contains_me()) {
    auto want = spec_.local_shape(mesh_.coordinate());
    HP_CHECK(local_.sizes().vec() == want)
        << "rank " << mesh_.rank() << " holds a local tensor of shape " << local_.sizes() << " but "
        << spec_.to_string() << " gives it shape " << to_string_list(want);
  }
}

at::TensorOptions tensor_options(const DeviceMesh& mesh, at::ScalarType dtype) {
  return at::TensorOptions().dtype(dtype).device(c10::Device(mesh.device_type()));
}

bool awaits_init(const DTensor& t) { return t.to_local().is_meta() && t.device_mesh().device_type() != "meta"; }

std::string not_drawn_yet(const std::string& what, const std::string& when) {
  return what + " was made inside nn::no_init_parameters() and is not drawn yet: call nn::init_parameters(model) " + when;
}

DTensor DTensor::from_local(at::Tensor local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            std::optional<std::vector<int64_t>> shape) {
  std::vector<int64_t> global = shape ? *shape : local.sizes().vec();
  if (!shape) {
    for (int k = 0; k < mesh.ndim() && k < static_cast<int>(placements.size()); ++k)
      if (placements[k].is_shard()) {
        int d = placements[k].dim();
        if (d < 0) d += local.dim();
        HP_CHECK(d >= 0 && d < local.dim()) << "placement " << placements[k] << " names a dim outside "
                                            << "the local shape " << local.sizes();
        global[d] *= mesh.size(k);
      }
  }
  return DTensor(std::move(local), mesh, make_spec(global, local.scalar_type(), mesh, std::move(placements)));
}

DTensor& DTensor::defer_grad_reduction(const std::vector<int>& mesh_dims) {
  for (int k : mesh_dims) {
    HP_CHECK(k >= 0 && k < mesh_.ndim()) << "defer_grad_reduction: mesh dim " << k << " is not in "
                                         << mesh_.to_string();
    HP_CHECK(spec_.placement(k).is_replicate())
        << "defer_grad_reduction: " << spec_.to_string() << " is not replicated on mesh dim " << k;
    deferred_grad_dims_ |= 1u << k;
  }
  return *this;
}

int64_t DTensor::size(int64_t d) const {
  HP_CHECK(d >= -dim() && d < dim()) << "dim " << d << " out of range for shape " << to_string_list(sizes());
  return sizes()[d < 0 ? d + dim() : d];
}

DTensor DTensor::redistribute(std::vector<Placement> placements) const {
  ShardSpec target = make_spec(sizes(), scalar_type(), mesh_, std::move(placements));
  return DTensor(redistribute_local(local_, spec_, target, mesh_), mesh_, target);
}

at::Tensor DTensor::full_tensor() const {
  return redistribute(std::vector<Placement>(mesh_.ndim(), Replicate())).to_local();
}

std::optional<DTensor> DTensor::grad() const {
  if (!local_.grad().defined()) return std::nullopt;
  const double scale = avg_gradient_scale(spec_);
  return DTensor(scale == 1 ? local_.grad() : local_.grad() / scale, mesh_, gradient_spec(spec_));
}

DTensor DTensor::detach() const { return DTensor(local_.detach(), mesh_, spec_); }

DTensor& DTensor::requires_grad_(bool on) {
  local_.requires_grad_(on);
  return *this;
}

std::string DTensor::to_string() const {
  std::ostringstream os;
  os << "DTensor(shape " << to_string_list(sizes()) << ", " << scalar_type() << ", placements "
     << to_string_list(placements()) << ", " << mesh_.to_string() << ", local " << local_.sizes() << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const DTensor& t) { return os << t.to_string(); }

DTensor distribute_tensor(const at::Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements,
                          int src_rank) {
  at::Tensor source = full;
  if (src_rank >= 0) {
    // Shape and dtype travel first, so other ranks need not know them.
    const comm::Group& g = mesh.whole_group();
    const int src = g.group_rank_of(src_rank);
    const bool mine = mesh.rank() == src_rank;
    HP_CHECK(!mine || full.defined()) << "distribute_tensor: source rank " << src_rank
                                      << " passed an undefined tensor";
    at::Tensor header = at::zeros({10}, at::kLong);
    if (mine) {
      HP_CHECK(full.dim() <= 8) << "distribute_tensor supports up to 8 dims, got " << full.sizes();
      header[0] = full.dim();
      header[1] = static_cast<int64_t>(full.scalar_type());
      for (int64_t d = 0; d < full.dim(); ++d) header[2 + d] = full.size(d);
    }
    comm::broadcast_(header, g, src);
    auto h = header.accessor<int64_t, 1>();
    std::vector<int64_t> shape(h[0]);
    for (int64_t d = 0; d < h[0]; ++d) shape[d] = h[2 + d];
    source = mine ? full.contiguous().clone()
                  : at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[1])));
    comm::broadcast_(source, g, src);
  }
  HP_CHECK(source.defined()) << "distribute_tensor needs a tensor (or a source rank)";
  ShardSpec spec = make_spec(source.sizes().vec(), source.scalar_type(), mesh, std::move(placements));
  at::Tensor local = local_piece(source.detach(), spec, mesh.coordinate()).contiguous().clone();
  if (full.defined() && full.requires_grad()) local.requires_grad_(true);
  return DTensor(local, mesh, spec);
}

}  // namespace hp
