// Checking a schedule before anyone runs it.
#pragma once

#include "hp/schedule/action.h"
#include "hp/schedule/simulate.h"

namespace hp::schedule {

// Throws hp::Error naming the rank, position and action at fault unless:
//  - sizes agree and every action runs on the rank that owns its stage;
//  - every (stage, microbatch) has exactly one F and exactly one B or one I + W;
//  - every SEND has exactly one matching RECV on its peer and vice versa, and
//    every dependency that crosses ranks goes through such a pair;
//  - on each rank, F(s) follows F(s-1) or RECV_F(s); B|I(s) follows F(s) and
//    B|I(s+1) or RECV_B(s); W(s) follows I(s); SEND follows what it sends;
//  - executing the lists with blocking receives and sends of capacity
//    `send_capacity` (kUnboundedSends: isend; 0: rendezvous) terminates.
void validate(const Schedule& s, int send_capacity = kUnboundedSends);

}  // namespace hp::schedule
