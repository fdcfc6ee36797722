#include "hp/comm/symm/symm.h"

#include <ATen/ATen.h>

#include <atomic>
#include <optional>
#include <string>

#include "hp/base/error.h"
#include "hp/comm/engine.h"
#include "hp/comm/group.h"

namespace hp::symm {
namespace {

std::shared_ptr<Heap> heap_of(const at::Tensor& t, const char* op) {
  auto h = t.defined() ? Heap::owning(t.data_ptr()) : nullptr;
  HP_CHECK(h) << op << ": the tensor is not in a symmetric heap (allocate it with hp::symm::empty)";
  return h;
}

std::shared_ptr<Heap> local_heap_of(const comm::Group& g, const char* op) {
  HP_CHECK(g.on_one_host()) << op << " on " << g.describe() << ": the group spans hosts; symmetric memory "
                            << "needs every rank on one host";
  return group_heap(g);
}

// For the calls that synchronise with peers through the heap: after this rank's
// asynchronous collectives, which use the same heap from the progress engine.
std::shared_ptr<Heap> heap_of(const comm::Group& g, const char* op) {
  auto h = local_heap_of(g, op);
  if (comm::Engine* e = g.engine()) e->drain();
  return h;
}

// Elements [offset, offset + numel) of peer's instance of `t`, flattened.
at::Tensor peer_range(const at::Tensor& t, int peer, int64_t offset, int64_t numel, const char* op) {
  auto h = heap_of(t, op);
  HP_CHECK(peer >= 0 && peer < h->size()) << op << " on " << h->what() << ": peer " << peer
                                          << " is outside the group";
  HP_CHECK(t.is_contiguous()) << op << ": the symmetric tensor must be contiguous";
  HP_CHECK(offset >= 0 && offset + numel <= t.numel())
      << op << ": elements [" << offset << ", " << offset + numel << ") fall outside the symmetric tensor of "
      << t.numel();
  return peer_view(t, peer).view({-1}).narrow(0, offset, numel);
}

std::atomic<void (*)(int64_t)> allocation_observer{nullptr};

}  // namespace

void set_allocation_observer(void (*observer)(int64_t delta_bytes)) { allocation_observer.store(observer); }

namespace {

int64_t bytes_of(at::IntArrayRef shape, at::ScalarType dtype) {
  const int64_t numel = c10::multiply_integers(shape);
  HP_CHECK(numel >= 0) << "hp::symm::empty: bad shape " << shape;
  return numel * static_cast<int64_t>(c10::elementSize(dtype));
}

// The tensor over `bytes` at `off` from h's user(), which it gives back when it dies.
at::Tensor heap_tensor(const std::shared_ptr<Heap>& h, size_t off, int64_t bytes, at::IntArrayRef shape,
                       at::ScalarType dtype) {
  auto* observer = allocation_observer.load();
  if (observer) observer(bytes);
  return at::from_blob(
      h->user(h->rank()) + off, shape,
      [h, off, observer, bytes](void*) {
        h->release(off);
        if (observer) observer(-bytes);
      },
      at::TensorOptions().dtype(dtype));
}

}  // namespace

// Every rank's tensor must lie at the same offset, or put and get would land elsewhere:
// the barrier checks the offsets every rank announced (agreement.h), and fails on every
// rank where one differs or some rank had no room.
at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype, const comm::Group& g) {
  std::shared_ptr<Heap> h = heap_of(g, "hp::symm::empty");
  const int64_t bytes = bytes_of(shape, dtype);
  std::optional<size_t> off;
  std::string full;
  try {
    off = h->allocate(bytes);
  } catch (const Error& e) {
    full = e.what();
  }
  at::Tensor t = off ? heap_tensor(h, *off, bytes, shape, dtype) : at::Tensor();  // freed if the check fails
  h->announce(empty_call(bytes, off));
  h->barrier("hp::symm::empty");
  HP_CHECK(t.defined()) << full;  // no rank had room
  return t;
}

at::Tensor try_empty(at::IntArrayRef shape, at::ScalarType dtype, const comm::Group& g) {
  std::shared_ptr<Heap> h = heap_of(g, "hp::symm::try_empty");
  const int64_t bytes = bytes_of(shape, dtype);
  size_t off = 0;
  at::Tensor t;
  if (h->try_allocate(bytes, &off)) t = heap_tensor(h, off, bytes, shape, dtype);
  const int row = h->next_exchange();
  h->control(h->rank()).allocated[row] = t.defined() ? off + 1 : 0;
  h->announce(try_empty_call(bytes));
  h->barrier("hp::symm::try_empty");
  // No room on some rank, or ranks whose allocations went in different orders: no
  // symmetric tensor to be had.
  for (int r = 0; r < h->size(); ++r)
    if (h->control(r).allocated[row] != h->control(h->rank()).allocated[row] || !t.defined()) return at::Tensor();
  return t;
}

at::Tensor try_local_empty(int64_t numel, at::ScalarType dtype, const comm::Group& g) {
  std::shared_ptr<Heap> h = local_heap_of(g, "hp::symm::try_local_empty");
  const int64_t bytes = bytes_of({numel}, dtype);
  size_t off = 0;
  if (!h->try_allocate_local(bytes, &off)) return at::Tensor();
  return heap_tensor(h, off, bytes, {numel}, dtype);
}

bool is_symmetric(const at::Tensor& t) { return t.defined() && Heap::owning(t.data_ptr()) != nullptr; }

at::Tensor peer_view(const at::Tensor& t, int peer) {
  auto h = heap_of(t, "peer_view");
  HP_CHECK(peer >= 0 && peer < h->size()) << "peer_view on " << h->what() << ": peer " << peer
                                          << " is outside the group";
  const char* p = static_cast<const char*>(t.data_ptr());
  const size_t off = p - h->user(h->rank());
  return at::from_blob(h->user(peer) + off, t.sizes(), t.strides(), [h](void*) {}, t.options());
}

void put(const at::Tensor& dst, const at::Tensor& src, int peer, int64_t dst_offset) {
  HP_CHECK(src.scalar_type() == dst.scalar_type())
      << "put: source dtype " << src.scalar_type() << " differs from the symmetric tensor's " << dst.scalar_type();
  peer_range(dst, peer, dst_offset, src.numel(), "put").copy_(src.reshape({-1}));
}

void get(at::Tensor dst, const at::Tensor& src, int peer, int64_t src_offset) {
  HP_CHECK(src.scalar_type() == dst.scalar_type())
      << "get: destination dtype " << dst.scalar_type() << " differs from the symmetric tensor's "
      << src.scalar_type();
  at::Tensor from = peer_range(src, peer, src_offset, dst.numel(), "get");
  dst.copy_(from.view(dst.sizes()));
}

void signal(const comm::Group& g, int peer, int slot, uint64_t value, SignalOp op) {
  heap_of(g, "signal")->signal(peer, slot, value, op);
}

uint64_t wait_signal(const comm::Group& g, int slot, uint64_t value, std::chrono::milliseconds timeout) {
  return heap_of(g, "wait_signal")->wait_signal(slot, value, timeout.count() > 0 ? timeout : g.timeout());
}

void barrier(const comm::Group& g) {
  std::shared_ptr<Heap> h = heap_of(g, "hp::symm::barrier");
  h->announce(barrier_call());
  h->barrier("hp::symm::barrier");
}

}  // namespace hp::symm
