#include "hp/comm/device_mesh.h"

#include "hp/base/error.h"
#include "hp/base/strings.h"

namespace hp {
namespace {

std::shared_ptr<comm::World> world_or_current(std::shared_ptr<comm::World> w) {
  return w ? w : comm::current_world();
}

}  // namespace

DeviceMesh::DeviceMesh(std::string device_type, MeshShape shape, std::shared_ptr<comm::World> world)
    : device_(std::move(device_type)), shape_(std::move(shape)), world_(world_or_current(std::move(world))) {
  for (int r : shape_.ranks())
    HP_CHECK(r < world_->size()) << "mesh " << shape_.to_string() << " names rank " << r
                                 << " but the world has " << world_->size() << " ranks";
  if (!contains_me()) return;
  for (int d = 0; d < shape_.ndim(); ++d)
    groups_.push_back(world_->group(shape_.group_along(world_->rank(), {d}), device_));
}

bool DeviceMesh::contains_me() const { return shape_.contains(world_->rank()); }

int DeviceMesh::rank() const { return world_->rank(); }

std::vector<int64_t> DeviceMesh::coordinate() const { return shape_.coord_of(world_->rank()); }

int64_t DeviceMesh::local_rank(int dim) const { return coordinate().at(dim); }

const comm::Group& DeviceMesh::group(int dim) const {
  HP_CHECK(contains_me()) << "rank " << world_->rank() << " is not in " << to_string();
  HP_CHECK(dim >= 0 && dim < ndim()) << "mesh dim " << dim << " out of range for " << to_string();
  return *groups_[dim];
}

const comm::Group& DeviceMesh::whole_group() const {
  HP_CHECK(contains_me()) << "rank " << world_->rank() << " is not in " << to_string();
  if (!whole_) whole_ = world_->group(shape_.ranks(), device_);
  return *whole_;
}

DeviceMesh DeviceMesh::operator[](const std::string& dim) const {
  return submesh({dim});
}

DeviceMesh DeviceMesh::submesh(const std::vector<std::string>& dims) const {
  HP_CHECK(contains_me()) << "rank " << world_->rank() << " is not in " << to_string()
                          << " and cannot take its sub-mesh " << to_string_list(dims);
  std::vector<int> idx;
  for (const auto& n : dims) idx.push_back(shape_.dim_index(n));
  return DeviceMesh(device_, shape_.submesh(world_->rank(), idx), world_);
}

DeviceMesh DeviceMesh::flatten(const std::string& name) const {
  return DeviceMesh(device_, shape_.flatten(name), world_);
}

std::string DeviceMesh::to_string() const { return "DeviceMesh(" + device_ + ", " + shape_.to_string() + ")"; }

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names) {
  auto world = comm::current_world();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  HP_CHECK(n == world->size()) << "init_device_mesh: shape " << to_string_list(shape) << " holds " << n
                          << " ranks but the world has " << world->size();
  return DeviceMesh(device_type, MeshShape(shape, dim_names), world);
}

}  // namespace hp
