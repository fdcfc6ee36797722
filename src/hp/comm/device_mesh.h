// DeviceMesh: a MeshShape of global ranks plus one process group per mesh dim,
// created once (when the mesh is built) and shared by every sub-mesh.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hp/comm/group.h"
#include "hp/comm/world.h"
#include "hp/topology/mesh_shape.h"

namespace hp {

class DeviceMesh {
 public:
  // Joins (creates) this rank's group along every mesh dim. Ranks outside the mesh
  // may hold it (to address another pipeline stage) but cannot communicate on it.
  DeviceMesh(std::string device_type, MeshShape shape,
             std::shared_ptr<comm::World> world = nullptr);

  const MeshShape& shape() const { return shape_; }
  const std::string& device_type() const { return device_; }
  int ndim() const { return shape_.ndim(); }
  int64_t size() const { return shape_.size(); }
  int64_t size(int dim) const { return shape_.dim_size(dim); }
  const std::vector<std::string>& dim_names() const { return shape_.names(); }
  bool contains_me() const;
  int rank() const;  // this process's global rank
  // The hosts and network of the world the mesh lives in (global ranks as devices): what
  // the redistribution planner prices its steps on.
  const ClusterTopology& topology() const { return world_->topology(); }

  std::vector<int64_t> coordinate() const;  // of this rank
  int64_t local_rank(int dim) const;        // this rank's coordinate along `dim`
  int64_t local_rank(const std::string& dim) const { return local_rank(shape_.dim_index(dim)); }
  const comm::Group& group(int dim) const;
  const comm::Group& group(const std::string& dim) const { return group(shape_.dim_index(dim)); }
  // The group of every rank in the mesh (created on first use: call it on all ranks).
  const comm::Group& whole_group() const;

  DeviceMesh operator[](const std::string& dim) const;
  DeviceMesh operator[](std::initializer_list<std::string> dims) const { return submesh(dims); }
  DeviceMesh submesh(const std::vector<std::string>& dims) const;
  // The mesh as one dim (its group is created now: call it on all ranks of the mesh).
  DeviceMesh flatten(const std::string& name = "") const;

  bool operator==(const DeviceMesh& o) const { return device_ == o.device_ && shape_ == o.shape_; }
  bool operator!=(const DeviceMesh& o) const { return !(*this == o); }
  std::string to_string() const;

 private:
  std::string device_;
  MeshShape shape_;
  std::shared_ptr<comm::World> world_;
  std::vector<std::shared_ptr<comm::Group>> groups_;  // per dim; empty when not a member
  mutable std::shared_ptr<comm::Group> whole_;
};

// A mesh of shape `shape` over ranks 0..N-1 of the current world (N must be its size).
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names = {});

}  // namespace hp
