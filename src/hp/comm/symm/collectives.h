// Collectives over the symmetric heap, for groups whose ranks share a host. They move
// bytes with memcpy through each rank's scratch window, chunk by chunk, with one barrier
// per chunk, and are synchronous.
//
// Reductions are deterministic: element i is always op(x_0[i], x_1[i], ..., x_{n-1}[i])
// folded in rank order, with 16-bit floats accumulated in float32, whatever the timing.
// A large all-reduce is a reduce-scatter (each rank folds its 1/n of every chunk, reading
// its peers' inputs in place) followed by an all-gather of the folded slices.
//
// Buffers in the symmetric heap on every rank (hp::symm::empty) skip the windows: from
// 256 KiB (or one step), ranks publish where their buffers lie and, if all are in the
// heap, read each other's in place, one copy per byte; broadcast then spreads the copying
// over all ranks, the root included. Otherwise (a buffer is private on some rank) the
// windows carry it, but for all-gather and all-to-all outputs in the heap, which senders
// write into, cross-memory reads and writes (cross_memory.h) for all-to-all and
// broadcast, whose root then copies a share into every receiver. From 4 steps (1 MiB),
// all-reduce may first stage a private tensor in the heap, where there is room (one
// copy), and then read it in place: whether it does is timed per message size
// (HP_SHM_STAGING=1 always, 0 never).
//
// Every rank must make the same calls in the same order with the same sizes, reduce op,
// dtype and root. Each call checks so at its first barrier, before any data moves between
// ranks (agreement.h): where ranks differ, every rank fails, naming what each passed,
// instead of pairing with a peer's other call. Every call passes a barrier, empty ones too.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

#include "hp/base/reduce_op.h"
#include "hp/comm/symm/heap.h"

namespace hp::comm {
class Group;
}

namespace hp::symm {

// Whether hp::comm runs `g`'s collectives here: a cpu group of 2..kMaxRanks ranks on one
// host, and HP_SHM_COLLECTIVES is not 0.
bool shm_collectives_enabled(const comm::Group& g);
// Whether the reductions here handle `dtype` (floating and integral types).
bool can_reduce(at::ScalarType dtype);
// A buffer of `numel` elements in g's symmetric heap, which g's collectives read in place;
// undefined where they do not run here, cannot reduce `dtype`, or some rank's heap has no
// room. Collective over g when they run here (try_empty): all ranks get the same answer.
at::Tensor try_in_place_buffer(int64_t numel, at::ScalarType dtype, const comm::Group& g);

// The output of an all-gather or all-to-all of `numel` elements over g, in this rank's
// local region of the heap so that peers write their pieces straight into it; undefined
// where that gains nothing (below 256 KiB) or there is no room. Not collective.
at::Tensor try_output_buffer(int64_t numel, at::ScalarType dtype, const comm::Group& g);

// `t`: contiguous, reduced in place.
void all_reduce(Heap& h, at::Tensor t, ReduceOp op);
// `in`: contiguous, every rank's the same numel; this rank's result, `counts[rank]`
// elements starting at sum(counts[<rank]), goes to `out` (contiguous).
void reduce_scatter(Heap& h, const at::Tensor& in, at::Tensor out, const std::vector<int64_t>& counts,
                    ReduceOp op);
// The same with the input in pieces: in[r] holds the counts[r] elements (of `dtype`) whose
// reduction goes to rank r; this rank's lands in `out`. The pieces may lie anywhere.
void reduce_scatter(Heap& h, const std::vector<const char*>& in, const std::vector<int64_t>& counts, void* out,
                    at::ScalarType dtype, ReduceOp op);
// Rank r contributes bytes[r] bytes (`bytes` the same on every rank); `out` receives them
// all, back to back in rank order.
void all_gather(Heap& h, const void* in, const std::vector<size_t>& bytes, void* out);
// The same with rank r's bytes landing at out[r].
void all_gather(Heap& h, const void* in, const std::vector<size_t>& bytes, const std::vector<char*>& out);
// send[s] bytes of `in` (back to back) go to rank s; recv[r] bytes from rank r land in
// `out`, back to back in rank order. Every rank's sizes are checked against its peers'.
void all_to_all(Heap& h, const void* in, const std::vector<size_t>& send, void* out,
                const std::vector<size_t>& recv);
void broadcast(Heap& h, void* data, size_t bytes, int root);

}  // namespace hp::symm
