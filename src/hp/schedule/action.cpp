#include "hp/schedule/action.h"

#include <cctype>
#include <sstream>

#include "hp/base/error.h"

namespace hp::schedule {

namespace {

constexpr ActionType kAllTypes[] = {
    ActionType::F,      ActionType::B,      ActionType::I,      ActionType::W,
    ActionType::SEND_F, ActionType::RECV_F, ActionType::SEND_B, ActionType::RECV_B,
    ActionType::UNSHARD, ActionType::RESHARD};

// Reads a non-negative integer at text[pos...]; -1 when there is none.
int read_int(const std::string& text, size_t& pos) {
  if (pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[pos]))) return -1;
  int v = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])))
    v = v * 10 + (text[pos++] - '0');
  return v;
}

}  // namespace

const char* to_string(ActionType t) {
  switch (t) {
    case ActionType::F: return "F";
    case ActionType::B: return "B";
    case ActionType::I: return "I";
    case ActionType::W: return "W";
    case ActionType::SEND_F: return "SEND_F";
    case ActionType::RECV_F: return "RECV_F";
    case ActionType::SEND_B: return "SEND_B";
    case ActionType::RECV_B: return "RECV_B";
    case ActionType::UNSHARD: return "UNSHARD";
    case ActionType::RESHARD: return "RESHARD";
  }
  return "?";
}

bool is_compute(ActionType t) {
  return t == ActionType::F || t == ActionType::B || t == ActionType::I || t == ActionType::W;
}
bool is_send(ActionType t) { return t == ActionType::SEND_F || t == ActionType::SEND_B; }
bool is_recv(ActionType t) { return t == ActionType::RECV_F || t == ActionType::RECV_B; }

std::string to_string(const Action& a) {
  std::string s = to_string(a.type);
  s += std::to_string(a.stage);
  if (a.type != ActionType::UNSHARD && a.type != ActionType::RESHARD)
    s += "." + std::to_string(a.microbatch);
  if (is_send(a.type)) s += ">" + std::to_string(a.peer);
  if (is_recv(a.type)) s += "<" + std::to_string(a.peer);
  return s;
}

Action parse_action(const std::string& text) {
  // Longest type name first, so "RECV_F" is not read as "R...".
  size_t name_len = 0;
  ActionType type = ActionType::F;
  for (ActionType t : kAllTypes) {
    std::string n = to_string(t);
    if (text.compare(0, n.size(), n) == 0 && n.size() > name_len) {
      name_len = n.size();
      type = t;
    }
  }
  HP_CHECK(name_len > 0) << "cannot parse action '" << text << "': unknown type";
  Action a{type, 0, 0, -1};
  size_t pos = name_len;
  a.stage = read_int(text, pos);
  HP_CHECK(a.stage >= 0) << "cannot parse action '" << text << "': expected a stage number";
  if (type != ActionType::UNSHARD && type != ActionType::RESHARD) {
    HP_CHECK(pos < text.size() && text[pos] == '.')
        << "cannot parse action '" << text << "': expected '.' and a microbatch";
    ++pos;
    a.microbatch = read_int(text, pos);
    HP_CHECK(a.microbatch >= 0) << "cannot parse action '" << text << "': expected a microbatch";
  }
  if (is_comm(type)) {
    char want = is_send(type) ? '>' : '<';
    HP_CHECK(pos < text.size() && text[pos] == want)
        << "cannot parse action '" << text << "': expected '" << want << "' and a peer rank";
    ++pos;
    a.peer = read_int(text, pos);
    HP_CHECK(a.peer >= 0) << "cannot parse action '" << text << "': expected a peer rank";
  }
  HP_CHECK(pos == text.size()) << "cannot parse action '" << text << "': trailing characters";
  return a;
}

Action matching_comm(const Action& a, int rank) {
  switch (a.type) {
    case ActionType::SEND_F: return {ActionType::RECV_F, a.stage + 1, a.microbatch, rank};
    case ActionType::RECV_F: return {ActionType::SEND_F, a.stage - 1, a.microbatch, rank};
    case ActionType::SEND_B: return {ActionType::RECV_B, a.stage - 1, a.microbatch, rank};
    case ActionType::RECV_B: return {ActionType::SEND_B, a.stage + 1, a.microbatch, rank};
    default: break;
  }
  HP_FAIL() << "matching_comm: " << to_string(a) << " is not a SEND or RECV";
  return a;
}

int Schedule::rank_of(int stage) const {
  HP_CHECK(stage >= 0 && stage < static_cast<int>(stage_to_rank.size()))
      << "stage " << stage << " out of range [0, " << stage_to_rank.size() << ")";
  return stage_to_rank[stage];
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(stage_to_rank.size()); ++s)
    if (stage_to_rank[s] == rank) out.push_back(s);
  return out;
}

bool Schedule::has_comm() const {
  for (const auto& list : actions)
    for (const Action& a : list)
      if (is_comm(a.type)) return true;
  return false;
}

std::string Schedule::to_string(bool with_comm) const {
  std::ostringstream os;
  for (size_t r = 0; r < actions.size(); ++r) {
    os << "rank " << r << ":";
    for (const Action& a : actions[r])
      if (with_comm || !is_comm(a.type)) os << ' ' << hp::schedule::to_string(a);
    os << '\n';
  }
  return os.str();
}

std::vector<int> loop_stage_map(int num_ranks, int stages_per_rank) {
  HP_CHECK(num_ranks >= 1) << "need at least one rank, got " << num_ranks;
  HP_CHECK(stages_per_rank >= 1) << "need at least one stage per rank, got " << stages_per_rank;
  std::vector<int> map(static_cast<size_t>(num_ranks) * stages_per_rank);
  for (size_t s = 0; s < map.size(); ++s) map[s] = static_cast<int>(s) % num_ranks;
  return map;
}

std::vector<int> v_stage_map(int num_ranks) {
  HP_CHECK(num_ranks >= 1) << "need at least one rank, got " << num_ranks;
  std::vector<int> map(2 * num_ranks);
  for (int s = 0; s < 2 * num_ranks; ++s) map[s] = s < num_ranks ? s : 2 * num_ranks - 1 - s;
  return map;
}

}  // namespace hp::schedule
