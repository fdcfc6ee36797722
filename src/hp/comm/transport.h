// Which transport carries a collective, chosen once per (group, op, bytes, dtype). The one
// table of which runs when:
//
//   transport      runs when                                              progress
//   Local          the group has one rank                                 a copy, at once
//   Hierarchical   a cpu group over 2+ hosts of equal consecutive blocks,  progress engine
//                  all-reduce / all-gather / reduce-scatter, where the
//                  cost model prefers it (hier::chosen; HP_HIER_COLLECTIVES)
//   SharedMemory   a cpu group of 2..256 ranks on one host; reductions    progress engine
//                  in a dtype the folds handle (HP_SHM_COLLECTIVES=0: off)
//   Gloo           everything else (NCCL on cuda meshes)                  c10d's own threads
//
// Inside SharedMemory the paths (windows, in-heap reads, staging, single-copy) are chosen
// per call by hp/comm/symm from where the buffers lie; every rank decides the same.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hp/comm/group.h"
#include "hp/topology/cluster.h"

namespace hp::comm {

enum class Transport { Local, Hierarchical, SharedMemory, Gloo };
const char* to_string(Transport t);

// `bytes` as ClusterTopology::cost counts them for `kind`; every rank decides the same.
Transport choose_transport(const Group& g, Collective kind, int64_t bytes, at::ScalarType dtype);

// Whether asynchronous shared-memory and hierarchical collectives go to the progress
// engine (HP_ASYNC_COLLECTIVES=0: they run to completion on the calling thread, as
// synchronous ones do, and asynchronous Gloo calls wait for their work before returning;
// read at each call, so benchmarks can alternate).
bool async_engine_enabled();

}  // namespace hp::comm
