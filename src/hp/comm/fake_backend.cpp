#include "hp/comm/fake_backend.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "hp/base/error.h"

namespace hp::comm {
namespace {

// Complete from birth: wait() returns at once, its future is already set.
class DoneWork : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(c10::List<at::Tensor>()));
    return f;
  }
};

}  // namespace

FakeBackend::FakeBackend(int rank, int size) : Backend(rank, size) {}

WorkPtr FakeBackend::done() {
  ++calls_;
  return c10::make_intrusive<DoneWork>();
}

WorkPtr FakeBackend::broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) { return done(); }
WorkPtr FakeBackend::allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) { return done(); }
WorkPtr FakeBackend::allreduce_coalesced(std::vector<at::Tensor>&, const c10d::AllreduceCoalescedOptions&) {
  return done();
}
WorkPtr FakeBackend::reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) { return done(); }
WorkPtr FakeBackend::allgather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                               const c10d::AllgatherOptions&) {
  return done();
}
WorkPtr FakeBackend::_allgather_base(at::Tensor&, at::Tensor&, const c10d::AllgatherOptions&) { return done(); }
WorkPtr FakeBackend::gather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                            const c10d::GatherOptions&) {
  return done();
}
WorkPtr FakeBackend::scatter(std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                             const c10d::ScatterOptions&) {
  return done();
}
WorkPtr FakeBackend::reduce_scatter(std::vector<at::Tensor>&, std::vector<std::vector<at::Tensor>>&,
                                    const c10d::ReduceScatterOptions&) {
  return done();
}
WorkPtr FakeBackend::_reduce_scatter_base(at::Tensor&, at::Tensor&, const c10d::ReduceScatterOptions&) {
  return done();
}
WorkPtr FakeBackend::alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                                   const c10d::AllToAllOptions&) {
  return done();
}
WorkPtr FakeBackend::alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&, const c10d::AllToAllOptions&) {
  return done();
}
WorkPtr FakeBackend::send(std::vector<at::Tensor>&, int, int) { return done(); }
WorkPtr FakeBackend::recv(std::vector<at::Tensor>&, int, int) { return done(); }
WorkPtr FakeBackend::recvAnysource(std::vector<at::Tensor>&, int) { return done(); }
WorkPtr FakeBackend::barrier(const c10d::BarrierOptions&) { return done(); }

bool is_fake(const Backend& b) { return b.getBackendName() == "fake"; }

std::shared_ptr<World> fake_world(int rank, int size) {
  HP_CHECK(size >= 1) << "fake_world: the job needs at least one rank, got " << size;
  HP_CHECK(rank >= 0 && rank < size) << "fake_world: rank " << rank << " is outside a job of " << size
                                     << " ranks (0.." << size - 1 << ")";
  DistEnv env;
  env.rank = rank;
  env.world_size = size;
  env.local_world_size = 1;  // every peer elsewhere: no shared-memory group
  env.launcher = "fake";
  auto world = std::make_shared<World>(rank, size, c10::make_intrusive<c10d::HashStore>(),
                                       std::chrono::milliseconds(1000), /*loopback=*/false, env);
  world->set_backend_factory([](const std::string&, int group_rank, int group_size) -> BackendPtr {
    return c10::make_intrusive<FakeBackend>(group_rank, group_size);
  });
  world->collective_log().enable();
  return world;
}

}  // namespace hp::comm
