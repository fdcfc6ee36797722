// Timing a schedule: start and end of every action, makespan, bubble, memory.
#pragma once

#include <vector>

#include "hp/schedule/action.h"

namespace hp::schedule {

// Sends are eager: a SEND posts its message and the rank moves on (isend) as
// long as fewer than `send_capacity` earlier messages to the same peer are still
// unreceived; otherwise it blocks until enough are. 0 is rendezvous (every send
// waits for its receive). A RECV blocks until its matching SEND has posted.
constexpr int kUnboundedSends = -1;

struct StageCost {
  double f = 1;  // forward
  double b = 2;  // full backward
  double i = 1;  // input-grad part of a split backward
  double w = 1;  // weight-grad part of a split backward
};

struct CostModel {
  StageCost uniform;
  std::vector<StageCost> per_stage;  // empty: `uniform` for every stage
  double latency = 0;                // from a send's post to its receive completing at the earliest
  // The same for forward activations when >= 0 (a runtime may send them differently from
  // gradients, e.g. behind a shape header); < 0: `latency`.
  double activation_latency = -1;
  int send_capacity = kUnboundedSends;
  // Cores the ranks share; 0: a core (or a device) each. With fewer cores than ranks, the
  // part of each compute action that needs a core (host_share of its stage: its host
  // arithmetic, timed alone) runs at cores / k of full speed while k > cores ranks are in
  // theirs; the rest (waiting on an accelerator) runs at full speed after it.
  int cores = 0;
  std::vector<double> host_share;  // per stage; empty: all of every action

  const StageCost& stage(int s) const;
  double host_share_of(int stage) const;
  double cost(const Action& a) const;  // SEND/RECV/UNSHARD/RESHARD take no rank time
  double latency_of(ActionType send) const;  // of the message a SEND_F or SEND_B posts
};

struct TimedAction {
  Action action;
  double start = 0;  // when the rank reached it
  double end = 0;    // when the rank moved on (for a RECV: when the data was there)
};

struct SimResult {
  std::vector<std::vector<TimedAction>> timeline;  // per rank, in list order
  double makespan = 0;
  double bubble_ratio = 0;           // 1 - compute time / (ranks * makespan)
  std::vector<double> busy;          // compute time per rank
  std::vector<int> peak_in_flight;   // per rank: most stage forwards whose backward is unfinished
};

// Validates `s` (see validate.h; throws hp::Error naming the problem), then times
// it with blocking receives and sends as `costs.send_capacity` says.
SimResult simulate(const Schedule& s, const CostModel& costs = {});

// The most (stage, microbatch) pairs on each rank whose F has run and whose B
// (or, when split, W) has not, following list order. Needs no timing.
std::vector<int> peak_in_flight(const Schedule& s);

}  // namespace hp::schedule
