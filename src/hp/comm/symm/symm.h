// One-sided communication inside a host, in the manner of NVSHMEM or a SuperPoD's pooled
// memory: tensors allocated at the same place in every rank's symmetric heap, which any
// rank of the group reads and writes directly.
//
//   auto box = hp::symm::empty({1024}, at::kFloat, g);     // collective: every rank, same order
//   hp::symm::put(box, x, peer);                           // x -> peer's box
//   hp::symm::signal(g, peer, /*slot=*/0, 1);              // release: the data before it is visible
//   hp::symm::wait_signal(g, /*slot=*/0, 1);               // acquire: the peer's puts have landed
//
// Ordering (see heap.h): put and get are plain copies; signal/wait_signal and barrier
// order them. Ranks are group ranks. The group must lie on one host.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>

#include "hp/comm/symm/heap.h"

namespace hp::comm {
class Group;
}

namespace hp::symm {

// A contiguous tensor in `g`'s symmetric heap, at the same offset on every rank. Every
// rank allocates (and drops) its symmetric tensors in the same order; it is freed when
// its last reference goes. Collective (one barrier): where ranks asked for different
// sizes, or their tensors landed at different offsets, or some rank has no room, every
// rank fails, naming what each rank got.
at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype, const comm::Group& g);

// Like empty, with its pages touched here, but where some rank has no room (its heap is
// full, or the shared-memory file system behind it), or the ranks' tensors would land at
// different offsets, every rank gets an undefined tensor instead. Collective: all ranks
// agree on the outcome; sizes that differ fail on every rank.
at::Tensor try_empty(at::IntArrayRef shape, at::ScalarType dtype, const comm::Group& g);

// A tensor in this rank's local region of g's heap (heap.h): its peers can reach it, but
// at an offset of its own, so it is no symmetric tensor (no put/get). The shared-memory
// collectives keep their outputs there, for peers to write into directly. Undefined where
// the region has no room. Not collective.
at::Tensor try_local_empty(int64_t numel, at::ScalarType dtype, const comm::Group& g);

// Called with +bytes when a symmetric tensor is allocated and -bytes when it is freed, so
// that host-memory accounting (hp::track_cpu_memory) sees the heap too. One observer for
// the process; a tensor reports its release to the observer that saw its allocation.
void set_allocation_observer(void (*observer)(int64_t delta_bytes));

// Whether `t` lives in a symmetric heap.
bool is_symmetric(const at::Tensor& t);

// Rank `peer`'s instance of symmetric tensor `t`, aliasing its memory.
at::Tensor peer_view(const at::Tensor& t, int peer);

// Copies `src` (any layout, `dst`'s dtype) into elements [dst_offset, dst_offset + numel)
// of peer `peer`'s instance of symmetric tensor `dst` (flattened).
void put(const at::Tensor& dst, const at::Tensor& src, int peer, int64_t dst_offset = 0);
// Copies dst.numel() elements from element `src_offset` of peer `peer`'s instance of
// symmetric tensor `src` into `dst`.
void get(at::Tensor dst, const at::Tensor& src, int peer, int64_t src_offset = 0);

// Sets (or adds `value` to) signal `slot` of `peer`, after all this rank's earlier writes.
void signal(const comm::Group& g, int peer, int slot, uint64_t value, SignalOp op = SignalOp::Set);
// Waits until this rank's signal `slot` holds at least `value`, then returns it; fails
// after `timeout` (default: the group's), or at once if a peer has died.
uint64_t wait_signal(const comm::Group& g, int slot, uint64_t value,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// Every rank of `g` has arrived, and all writes made before it are visible. A collective
// call like the others: a rank in another collective meanwhile fails it on every rank.
void barrier(const comm::Group& g);

}  // namespace hp::symm
