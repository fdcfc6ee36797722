#include <algorithm>
#include <limits>
#include <optional>

#include "hp/schedule/generator_util.h"
#include "hp/schedule/generators.h"

namespace hp::schedule {

namespace {

// A list scheduler on unit costs and zero latency. Every rank, whenever it is
// free, starts the best ready action; the resulting per-rank orders follow one
// global timeline, so they cannot deadlock once lowered (sends never wait).
class VGreedy {
 public:
  VGreedy(int p, int m)
      : p_(p), m_(m), S_(2 * p), done_(3, std::vector<double>(2 * p * m, kNever)),
        first_unstarted_(3, std::vector<int>(2 * p, 0)),
        last_started_(3, std::vector<int>(2 * p, -1)) {}

  Schedule run() {
    Schedule s = detail::empty_schedule("zbv", p_, m_, v_stage_map(p_));
    std::vector<double> free_at(p_, 0.0);
    std::vector<int> live(p_, 0);  // stage activations with F done and W not done
    std::vector<std::vector<std::pair<int, int>>> pending_w(p_);  // (stage, mb) with I done
    // Unit costs: every event lands on an integer time, so step through them.
    int left = 3 * 2 * m_ * p_;
    for (double t = 0; left > 0; t += 1.0) {
      HP_CHECK(t <= 6.0 * m_ * S_) << "zbv: no progress by t=" << t << " (p=" << p_ << ", m="
                                   << m_ << ")";
      std::vector<Action> started;
      for (int r = 0; r < p_; ++r) {
        if (free_at[r] > t) continue;
        if (auto pick = choose(r, t, live[r], pending_w[r])) {
          s.actions[r].push_back(*pick);
          started.push_back(*pick);
          free_at[r] = t + 1.0;
          --left;
          if (pick->type == ActionType::F) ++live[r];
          if (pick->type == ActionType::W) --live[r];
          if (pick->type == ActionType::I) pending_w[r].push_back({pick->stage, pick->microbatch});
        }
      }
      // Record ends only after every rank chose, so nothing started at t sees them.
      for (const Action& a : started) mark_started(a, t + 1.0);
    }
    return s;
  }

 private:
  // The best action rank r can start at time t, if any (see zbv() for the order).
  std::optional<Action> choose(int r, double t, int live,
                               std::vector<std::pair<int, int>>& pending_w) {
    const int chunk0 = r, chunk1 = S_ - 1 - r;
    // 1. Input grads: they are on the critical path back to stage 0. The lowest
    //    microbatch wins, the deeper stage on a tie.
    const int i1 = lowest_ready(ActionType::I, chunk1, t);
    const int i0 = lowest_ready(ActionType::I, chunk0, t);
    if (i1 < m_ && i1 <= i0) return compute(ActionType::I, chunk1, i1);
    if (i0 < m_) return compute(ActionType::I, chunk0, i0);
    // 2. Forwards, the deeper stage first; a new microbatch enters stage
    //    `chunk0` only while fewer than 2p stage activations are live.
    if (live < 2 * p_) {
      const int mb = lowest_ready(ActionType::F, chunk1, t);
      if (mb < m_) return compute(ActionType::F, chunk1, mb);
    }
    if (live < 2 * p_ - 1) {
      const int mb = lowest_ready(ActionType::F, chunk0, t);
      if (mb < m_) return compute(ActionType::F, chunk0, mb);
    }
    // 3. Weight grads fill what would otherwise be idle time.
    if (!pending_w.empty()) {
      auto [st, mb] = pending_w.front();
      pending_w.erase(pending_w.begin());
      return compute(ActionType::W, st, mb);
    }
    return std::nullopt;
  }

  static constexpr double kNever = std::numeric_limits<double>::infinity();

  static int kind(ActionType t) { return t == ActionType::F ? 0 : t == ActionType::I ? 1 : 2; }
  double& at(ActionType t, int stage, int mb) { return done_[kind(t)][stage * m_ + mb]; }
  bool finished(ActionType t, int stage, int mb, double now) { return at(t, stage, mb) <= now; }
  bool ready_f(int st, int mb, double now) {
    return at(ActionType::F, st, mb) == kNever && (st == 0 || finished(ActionType::F, st - 1, mb, now));
  }
  bool ready_i(int st, int mb, double now) {
    return at(ActionType::I, st, mb) == kNever && finished(ActionType::F, st, mb, now) &&
           (st == S_ - 1 || finished(ActionType::I, st + 1, mb, now));
  }

  void mark_started(const Action& a, double end) {
    at(a.type, a.stage, a.microbatch) = end;
    const int k = kind(a.type);
    int& first = first_unstarted_[k][a.stage];
    while (first < m_ && at(a.type, a.stage, first) != kNever) ++first;
    last_started_[k][a.stage] = std::max(last_started_[k][a.stage], a.microbatch);
  }

  // The lowest microbatch whose `type` action of stage `st` is ready at `now`, m_ if
  // none. Only microbatches not yet started, whose prerequisites have started, can be.
  int lowest_ready(ActionType type, int st, double now) {
    int bound = m_ - 1;
    if (type == ActionType::F && st > 0) bound = last_started_[0][st - 1];
    if (type == ActionType::I) {
      bound = last_started_[0][st];
      if (st < S_ - 1) bound = std::min(bound, last_started_[1][st + 1]);
    }
    for (int mb = first_unstarted_[kind(type)][st]; mb <= bound; ++mb)
      if (type == ActionType::F ? ready_f(st, mb, now) : ready_i(st, mb, now)) return mb;
    return m_;
  }

  int p_, m_, S_;
  std::vector<std::vector<double>> done_;  // [F, I, W][stage * m + mb]: end time
  std::vector<std::vector<int>> first_unstarted_, last_started_;  // [F, I, W][stage]: microbatch
};

}  // namespace

Schedule zbv(int num_ranks, int num_microbatches) {
  HP_CHECK(num_ranks >= 1) << "zbv: need at least 1 rank, got " << num_ranks;
  HP_CHECK(num_microbatches >= 1) << "zbv: need at least 1 microbatch, got " << num_microbatches;
  return VGreedy(num_ranks, num_microbatches).run();
}

}  // namespace hp::schedule
