// Hierarchical collectives for cpu groups that span hosts with the same number (2 or more)
// of ranks on each: shared memory inside each host (hp/comm/symm), Gloo across hosts among
// the ranks of equal local index, in pieces so that the cross-host phase of one piece
// overlaps the in-host phases of the next. hp::comm's collectives call them when the
// topology's cost model (hp/topology/hierarchical.h) prefers them; HP_HIER_COLLECTIVES=0
// turns them off, =1 uses them wherever they apply. They run to completion on the thread
// that calls them; hp::comm runs its asynchronous calls of them on the progress engine.
//
// Results are deterministic for a fixed layout and size: in-host folds go in local rank
// order, the cross-host reduction in Gloo's fixed order (all-reduce) or host order
// (reduce-scatter). They may differ in the last bits from the flat algorithm's, whose
// order is another.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "hp/base/reduce_op.h"
#include "hp/comm/group.h"
#include "hp/topology/cluster.h"

namespace hp::comm::hier {

// The topology the choice is priced on: hosts of `ranks_per_host` consecutive ranks
// (shared memory) joined by a network.
ClusterTopology host_topology(int world_size, int ranks_per_host);

// Bytes of a piece: HP_HIER_PIECE_KIB KiB (default 4096) of the message.
size_t piece_bytes();

// Off: never. Auto: where the cost model prefers them. On: wherever they apply.
enum class Mode { Off, Auto, On };
// HP_HIER_COLLECTIVES: "0" Off, "1" On, unset or anything else Auto; ScopedMode overrides.
Mode mode();

// Whether `kind` of `bytes` (as ClusterTopology::cost counts them) on `g` in `dtype` runs
// hierarchically: a group shape and dtype they handle, and the mode allows it. Every rank
// decides the same from the same arguments.
bool chosen(const Group& g, Collective kind, int64_t bytes, at::ScalarType dtype);

// Overrides HP_HIER_COLLECTIVES on this thread while alive (ranks as threads share one
// environment, so a test cannot flip it for one rank).
class ScopedMode {
 public:
  explicit ScopedMode(Mode m);
  ~ScopedMode();
  ScopedMode(const ScopedMode&) = delete;
  ScopedMode& operator=(const ScopedMode&) = delete;

 private:
  std::optional<Mode> previous_;
};

// How a group that spans hosts splits: this rank's host (`inner`, shared memory) and the
// ranks of the same local index on every host (`outer`).
struct HostLevels {
  int hosts = 0;
  int per_host = 0;
  int host = 0;   // this rank's host block: group ranks [host * per_host, (host + 1) * per_host)
  int local = 0;  // this rank's index inside it
  std::shared_ptr<Group> inner, outer;
};
// g's split, made on first use and kept with the group: a collective call (it creates the
// inner group, then the outer one, on every member in the same order). Throws unless the
// ranks form equal consecutive blocks on 2 or more hosts (hp/topology/hierarchical.h).
const HostLevels& host_levels(const Group& g);

// How many collectives this thread has run hierarchically: tests and probes check that
// the path was taken.
int64_t calls_on_this_thread();

// `t`: contiguous, reduced in place.
void all_reduce(const Group& g, at::Tensor t, ReduceOp op);
// Group rank r contributes bytes[r] bytes; `out` receives them back to back in group order.
void all_gather(const Group& g, const void* in, const std::vector<size_t>& bytes, void* out);
// `in`: contiguous, counts[r] elements for group rank r back to back; this rank's reduction
// of its counts[rank] elements goes to `out` (contiguous).
void reduce_scatter(const Group& g, const at::Tensor& in, const std::vector<int64_t>& counts, at::Tensor out,
                    ReduceOp op);

}  // namespace hp::comm::hier

namespace hp::comm::hier::detail {
void count_call();  // one more hierarchical collective on this thread
}  // namespace hp::comm::hier::detail
