// A c10d backend whose every collective and point-to-point op completes at once and moves
// no data (outputs keep whatever they held; meta tensors work). With fake_world, the real
// code of one rank of a large job runs on one machine: no peers, no rendezvous.
#pragma once

#include <memory>

#include "hp/comm/backend.h"
#include "hp/comm/world.h"

namespace hp::comm {

class FakeBackend : public Backend {
 public:
  FakeBackend(int rank, int size);
  const std::string getBackendName() const override { return "fake"; }

  WorkPtr broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) override;
  WorkPtr allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override;
  WorkPtr allreduce_coalesced(std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&) override;
  WorkPtr reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) override;
  WorkPtr allgather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                    const c10d::AllgatherOptions&) override;
  WorkPtr _allgather_base(at::Tensor&, at::Tensor&, const c10d::AllgatherOptions&) override;
  WorkPtr gather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                 const c10d::GatherOptions&) override;
  WorkPtr scatter(std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                  const c10d::ScatterOptions&) override;
  WorkPtr reduce_scatter(std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                         const c10d::ReduceScatterOptions&) override;
  WorkPtr _reduce_scatter_base(at::Tensor&, at::Tensor&, const c10d::ReduceScatterOptions&) override;
  WorkPtr alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                        const c10d::AllToAllOptions&) override;
  WorkPtr alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&, const c10d::AllToAllOptions&) override;
  WorkPtr send(std::vector<at::Tensor>&, int, int) override;
  WorkPtr recv(std::vector<at::Tensor>&, int, int) override;
  WorkPtr recvAnysource(std::vector<at::Tensor>&, int) override;
  WorkPtr barrier(const c10d::BarrierOptions&) override;

  int64_t calls() const { return calls_; }  // ops issued to this backend

 private:
  WorkPtr done();
  int64_t calls_ = 0;
};

bool is_fake(const Backend& b);

// Rank `rank` of a job of `size` ranks whose every group has a FakeBackend: built
// without rendezvous (a private HashStore), with its collective log enabled.
// Use it with ScopedWorld; groups spanning hosts as far as hp::comm is concerned,
// so no shared-memory path is taken.
std::shared_ptr<World> fake_world(int rank, int size);

}  // namespace hp::comm
