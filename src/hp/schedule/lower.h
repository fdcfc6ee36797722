// Lowering: from compute-only lists to lists with point-to-point transfers.
#pragma once

#include "hp/schedule/action.h"

namespace hp::schedule {

// Adds, for every dependency that crosses ranks, a SEND right after the
// producing compute and a RECV right before the consuming one:
//   F(s) -> SEND_F(s)  ...  RECV_F(s+1) -> F(s+1)
//   B|I(s) -> SEND_B(s) ... RECV_B(s-1) -> B|I(s-1)
// Adjacent stages on the same rank (the turn of a V) need no transfer.
// Sends are meant to be non-blocking (isend), so their place costs nothing;
// receives are placed as late as possible so a rank never waits early.
// Throws if `compute_only` already holds SEND/RECV actions.
Schedule lower_communication(const Schedule& compute_only);

}  // namespace hp::schedule
