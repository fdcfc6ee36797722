// The job as the hprun of every node sees it. Node 0's hprun hosts the rendezvous store
// for the whole job (on loopback when the job has one node); each attempt's ranks work in
// it under the attempt's prefix, and the hpruns meet there: the first failure of an
// attempt, on any node, is written to it and every node stops its ranks; then the nodes
// end the attempt together and restart, or give up, together.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "hp/comm/backend.h"
#include "options.h"
#include "supervisor.h"

namespace hp::run {

class Job {
 public:
  // Hosts the store (node 0) or joins it; throws naming the address it cannot reach.
  explicit Job(const Options& opt);
  int port() const { return port_; }

  // What an attempt's supervisor uses to hear of, and to tell, the other nodes.
  AttemptLink link(int attempt);

  // After this node's ranks of `attempt` have all ended: reports a failure (the first one
  // reported wins), waits for every node to end the attempt, and returns the job's
  // outcome, the same on every node. Bounded once a failure is known: a node that does not
  // follow within grace + 30 s is named and the job ends (never restarted).
  Outcome end_attempt(int attempt, const Outcome& local);

  // Before hprun exits: node 0 keeps serving until every node has read the last outcome.
  void leave();

 private:
  std::string key(int attempt, const std::string& what) const;
  void report(int attempt, const Outcome& failure);
  std::optional<Outcome> reported(int attempt);

  Options opt_;
  int port_ = 0;
  comm::StorePtr store_;
  std::chrono::steady_clock::time_point last_poll_;
};

}  // namespace hp::run
