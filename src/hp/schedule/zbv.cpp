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
  VGreedy(int p, int m) : p_(p), m_(m), S_(2 * p), done_(3, std::vector<double>(2 * p * m, kNever)) {}

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
      for (const Action& a : started) at(a.type, a.stage, a.microbatch) = t + 1.0;
    }
    return s;
  }

 private:
  // The best action rank r can start at time t, if any (see zbv() for the order).
  std::optional<Action> choose(int r, double t, int live,
                               std::vector<std::pair<int, int>>& pending_w) {
    const int chunk0 = r, chunk1 = S_ - 1 - r;
    // 1. Input grads: they are on the critical path back to stage 0.
    for (int mb = 0; mb < m_; ++mb)
      for (int st : {chunk1, chunk0})
        if (ready_i(st, mb, t)) return compute(ActionType::I, st, mb);
    // 2. Forwards, the deeper stage first; a new microbatch enters stage
    //    `chunk0` only while fewer than 2p stage activations are live.
    if (live < 2 * p_)
      for (int mb = 0; mb < m_; ++mb)
        if (ready_f(chunk1, mb, t)) return compute(ActionType::F, chunk1, mb);
    if (live < 2 * p_ - 1)
      for (int mb = 0; mb < m_; ++mb)
        if (ready_f(chunk0, mb, t)) return compute(ActionType::F, chunk0, mb);
    // 3. Weight grads fill what would otherwise be idle time.
    if (!pending_w.empty()) {
      auto [st, mb] = pending_w.front();
      pending_w.erase(pending_w.begin());
      return compute(ActionType::W, st, mb);
    }
    return std::nullopt;
  }

  static constexpr double kNever = std::numeric_limits<double>::infinity();

  double& at(ActionType t, int stage, int mb) {
    const int k = t == ActionType::F ? 0 : t == ActionType::I ? 1 : 2;
    return done_[k][stage * m_ + mb];
  }
  bool finished(ActionType t, int stage, int mb, double now) { return at(t, stage, mb) <= now; }
  bool ready_f(int st, int mb, double now) {
    return at(ActionType::F, st, mb) == kNever && (st == 0 || finished(ActionType::F, st - 1, mb, now));
  }
  bool ready_i(int st, int mb, double now) {
    return at(ActionType::I, st, mb) == kNever && finished(ActionType::F, st, mb, now) &&
           (st == S_ - 1 || finished(ActionType::I, st + 1, mb, now));
  }

  int p_, m_, S_;
  std::vector<std::vector<double>> done_;  // [F, I, W][stage * m + mb]: end time
};

}  // namespace

Schedule zbv(int num_ranks, int num_microbatches) {
  HP_CHECK(num_ranks >= 1) << "zbv: need at least 1 rank, got " << num_ranks;
  HP_CHECK(num_microbatches >= 1) << "zbv: need at least 1 microbatch, got " << num_microbatches;
  return VGreedy(num_ranks, num_microbatches).run();
}

}  // namespace hp::schedule
