// Pipeline schedules as data: one ordered list of actions per rank.
// Generators produce them, lower_communication() adds the point-to-point
// transfers, validate() checks them, simulate() times them, render draws them,
// and the pipeline runtime executes them without knowing which schedule it is.
#pragma once

#include <string>
#include <vector>

namespace hp::schedule {

enum class ActionType {
  F,       // forward of one microbatch through one stage
  B,       // full backward (input grad and weight grad together)
  I,       // backward for the input grad only (zero-bubble split)
  W,       // backward for the weight grad only, may be deferred
  SEND_F,  // send a stage's output activation to the next stage's rank
  RECV_F,  // receive a stage's input activation from the previous stage's rank
  SEND_B,  // send a stage's input grad to the previous stage's rank
  RECV_B,  // receive a stage's output grad from the next stage's rank
  // Parameter gathering for a sharded stage (FSDP); local, costless here.
  UNSHARD,
  RESHARD,
};

const char* to_string(ActionType t);
bool is_compute(ActionType t);  // F, B, I, W
bool is_send(ActionType t);
bool is_recv(ActionType t);
inline bool is_comm(ActionType t) { return is_send(t) || is_recv(t); }

// `stage` is the virtual stage the action belongs to on its own rank: a SEND
// names the sending stage, a RECV the receiving one. `peer` is the other rank of
// a SEND/RECV, -1 otherwise.
struct Action {
  ActionType type = ActionType::F;
  int stage = 0;
  int microbatch = 0;
  int peer = -1;

  bool operator==(const Action& o) const {
    return type == o.type && stage == o.stage && microbatch == o.microbatch && peer == o.peer;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// Compact text: "F3.1" (type, stage.microbatch), "SEND_F3.1>2", "RECV_F4.1<1".
std::string to_string(const Action& a);
Action parse_action(const std::string& text);  // inverse of to_string; throws on bad text

inline Action compute(ActionType t, int stage, int mb) { return Action{t, stage, mb, -1}; }

// The action the peer of a SEND/RECV on `rank` must hold to match it:
// SEND_F s>q <-> RECV_F (s+1)<rank, SEND_B s>q <-> RECV_B (s-1)<rank.
Action matching_comm(const Action& a, int rank);

struct Schedule {
  std::string name;
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<int> stage_to_rank;             // size num_stages
  std::vector<std::vector<Action>> actions;   // size num_ranks, in execution order

  int rank_of(int stage) const;               // checked
  std::vector<int> stages_of(int rank) const; // ascending
  bool has_comm() const;                      // true once lowered
  // One line per rank: "rank 0: F0.0 F0.1 ...", comm actions left out unless asked.
  std::string to_string(bool with_comm = true) const;
};

// Stage s on rank s % p: the classic loop (v stages per rank, v*p stages in all).
std::vector<int> loop_stage_map(int num_ranks, int stages_per_rank = 1);
// Stage s on rank s for s < p, on rank 2p-1-s after: the V used by ZB-V and
// DualPipeV, where the first and last stage share rank 0 and the turn (stages
// p-1, p) stays on rank p-1 without a transfer.
std::vector<int> v_stage_map(int num_ranks);

}  // namespace hp::schedule
