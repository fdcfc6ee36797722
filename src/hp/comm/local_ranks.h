// Runs N ranks as threads of this process over real Gloo (loopback), each with its own
// World: fast multi-rank tests and experiments without launching processes.
#pragma once

#include <chrono>
#include <functional>

namespace hp::comm {

// Calls fn(rank) on n threads. If any rank throws, rethrows (after all threads end) the
// lowest failing rank's error as hp::Error prefixed "rank R: ". A rank stuck in a
// collective gives up after `timeout`. `ranks_per_host` > 0 makes every block of that many
// ranks act as a host of its own (shared memory inside, Gloo on loopback between): how
// tests reach the hierarchical collectives without several machines.
void run_local_ranks(int n, const std::function<void(int rank)>& fn,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60), int ranks_per_host = 0);

}  // namespace hp::comm
