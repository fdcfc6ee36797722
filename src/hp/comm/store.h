// The rendezvous store (c10d's TCPStore): who hosts it, where it listens, and the key
// prefix each attempt of a restarted job works under.
#pragma once

#include <chrono>
#include <string>

#include "hp/base/dist_env.h"
#include "hp/comm/backend.h"

namespace hp::comm {

// A store server on `address`:`port` ("127.0.0.1" keeps it off the network; "" listens on
// every interface, for a job that spans hosts). c10d's own server always listens on every
// interface, so the socket is bound here and handed over. Port 0 picks a free one.
StorePtr host_store(const std::string& address, int port, std::chrono::milliseconds timeout);

// A client of the store at `host`:`port`; retries until `timeout`, then names the address.
StorePtr join_store(const std::string& host, int port, std::chrono::milliseconds timeout,
                    const std::string& who);

// The store this rank rendezvouses in. Under a launcher that hosts one (hprun, or
// torchrun's agent: TORCHELASTIC_USE_AGENT_STORE) every rank is a client and works under
// the attempt's prefix; otherwise rank 0 hosts it, on loopback when the job has one host.
StorePtr rendezvous_store(const DistEnv& env, std::chrono::milliseconds timeout);

// The key prefix of attempt `restart_count` in a launcher's store: hprun keeps one store
// for the whole job (torchrun's agent makes a fresh one per attempt; the prefix is harmless).
std::string attempt_prefix(int restart_count);

}  // namespace hp::comm
