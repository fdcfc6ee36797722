// The execution engine shared by validate() and simulate() (internal).
#pragma once

#include <string>
#include <vector>

#include "hp/schedule/action.h"
#include "hp/schedule/simulate.h"

namespace hp::schedule::detail {

struct Execution {
  std::vector<std::vector<TimedAction>> timeline;  // filled as far as each rank got
  std::vector<int> stopped_at;                     // per rank: first action not run
  bool deadlocked = false;
  std::string blocked;                             // why each stuck rank waits
};

// Runs every rank's list in order, receives blocking until their send posted
// and sends blocking per costs.send_capacity. Assumes matching has been checked.
Execution execute(const Schedule& s, const CostModel& costs);

// The same on costs.cores cores shared by the ranks, in time order: the host part of each
// compute action runs at min(1, cores / k) of full speed while k ranks are in theirs, the
// rest at full speed after it. Assumes the schedule is valid and does not deadlock
// (execute() has said so).
Execution execute_on_cores(const Schedule& s, const CostModel& costs);

// A point-to-point message, named by its send.
struct Message {
  bool posted = false;
  double post = 0;
  int index = 0;  // position among the messages sent on its (src, dst) channel
  bool received = false;
  double received_at = 0;
};

// Every message of a schedule, and per (src, dst) channel its messages in post order.
// Flat tables keep a long schedule's simulation linear in its length.
class Messages {
 public:
  explicit Messages(const Schedule& s);
  Message& of_send(const Action& send);
  // Posts `send`'s message (once) from rank `src` at time `t`.
  Message& post(const Action& send, int src, double t);
  // Whether `send` (posted) is free to complete under `capacity` at time `t` (every message
  // received by then counts), and when it became free; a rendezvous waits for its own receipt.
  bool free_at(const Action& send, int src, int capacity, double t, double* since) const;

 private:
  size_t index(const Action& send) const;

  const Schedule& s_;
  size_t per_type_;
  std::vector<Message> messages_;
  std::vector<std::vector<const Message*>> channels_;
};

}  // namespace hp::schedule::detail
