// Collectives over the symmetric heap, for groups whose ranks share a host. They move
// bytes with memcpy through each rank's scratch window, chunk by chunk, with one barrier
// per chunk, and are synchronous.
//
// Reductions are deterministic: element i is always op(x_0[i], x_1[i], ..., x_{n-1}[i])
// folded in rank order, with 16-bit floats accumulated in float32, whatever the timing.
// A large all-reduce is a reduce-scatter (each rank folds its 1/n of every chunk, reading
// its peers' inputs in place) followed by an all-gather of the folded slices.
//
// Which path a call takes (each collective's file says how each works). "Heap" means
// hp::symm memory (hp::symm::empty, or hp::comm's outputs and staged copies); the choice
// is made from the call's size alone, or, from 256 KiB (or one step), also from where
// every rank's buffers lie, which the ranks publish under the call's first barrier:
//
//   collective      path          when
//   all_reduce      one shot      up to 256 KiB (or one step)
//                   in heap       every rank's tensor in the heap (a private one staged
//                                 there from 4 steps, as staging_choice.h decides)
//                   windows       otherwise
//   reduce_scatter  in heap       from 256 KiB, every rank's pieces back to back in the heap
//                   windows       otherwise
//   all_gather      in place      from 256 KiB, each piece's input or output in the heap
//                   windows       otherwise
//   all_to_all      single copy   largest piece from 64 KiB, and cross-memory copies work
//                                 or each piece's input or output is in the heap
//                   windows       otherwise
//   broadcast       in heap       from 256 KiB, every rank's tensor in the heap
//                   split         from 256 KiB, the root's tensor readable by every
//                                 receiver (in the heap, or by cross-memory reads)
//                   windows       otherwise
//
// The windows path works for any buffers; the others move each byte once instead of
// twice (through a window), and take fewer barriers for large messages.
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
