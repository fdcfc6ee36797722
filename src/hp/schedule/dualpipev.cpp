#include <deque>

#include "hp/schedule/generator_util.h"
#include "hp/schedule/generators.h"

namespace hp::schedule {

namespace {

// Rank r's two chunks: stage r on the way down the V, stage 2p-1-r on the way back.
enum Chunk { kFirst = 0, kSecond = 1 };

// One rank's list as it is written. Each chunk takes microbatches in order, so
// the phases below only name a chunk; deferred weight grads run in the order
// their input grads ran.
class RankList {
 public:
  RankList(std::vector<Action>& out, int rank, int num_ranks)
      : out_(out), stage_{rank, 2 * num_ranks - 1 - rank} {}

  void forward(Chunk c) { out_.push_back(compute(ActionType::F, stage_[c], next_f_[c]++)); }
  void backward(Chunk c) { out_.push_back(compute(ActionType::B, stage_[c], next_b_[c]++)); }
  void input_grad(Chunk c) {
    const int mb = next_b_[c]++;
    out_.push_back(compute(ActionType::I, stage_[c], mb));
    deferred_w_.push_back(compute(ActionType::W, stage_[c], mb));
  }
  void weight_grad() {
    out_.push_back(deferred_w_.front());
    deferred_w_.pop_front();
  }
  bool has_deferred_weight_grads() const { return !deferred_w_.empty(); }

 private:
  std::vector<Action>& out_;
  int stage_[2];
  int next_f_[2] = {0, 0};
  int next_b_[2] = {0, 0};
  std::deque<Action> deferred_w_;
};

}  // namespace

Schedule dualpipev(int num_ranks, int num_microbatches) {
  const int p = num_ranks, m = num_microbatches;
  HP_CHECK(p >= 2) << "dualpipev: needs at least 2 ranks, got " << p;
  HP_CHECK(m >= 2 * p) << "dualpipev: needs num_microbatches >= 2 * num_ranks = " << 2 * p << ", got " << m
                       << " (so every rank reaches the steady phase, which rank 0 runs m - 2p + 1 times)";
  Schedule s = detail::empty_schedule("dualpipev", p, m, v_stage_map(p));
  for (int r = 0; r < p; ++r) {
    RankList on(s.actions[r], r, p);
    const int below = p - 1 - r;  // ranks r+1 .. p-1, from here to the turn of the V
    // 1. Warm-up: first-chunk forwards, two per rank below (down to the turn and
    //    back), so microbatch 0 returns just as phase 2 first needs it.
    for (int i = 0; i < 2 * below; ++i) on.forward(kFirst);
    // 2. Forwards of both chunks, alternating.
    for (int i = 0; i < r + 1; ++i) {
      on.forward(kFirst);
      on.forward(kSecond);
    }
    // 3. Second-chunk backward, then forward. The backward is split only so that
    //    its input grad is on its way to rank r+1 while the weight grad runs.
    for (int i = 0; i < below; ++i) {
      on.input_grad(kSecond);
      on.weight_grad();
      on.forward(kSecond);
    }
    // 4. Steady: each forward paired with a backward of the other chunk, the
    //    pairs DualPipe overlaps (one's compute hides the other's transfers;
    //    this runtime simply runs them in turn).
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {
      on.forward(kFirst);
      on.backward(kSecond);
      on.forward(kSecond);
      on.backward(kFirst);
    }
    // 5. The first chunk has forwarded everything; the second finishes.
    for (int i = 0; i < below; ++i) {
      on.backward(kSecond);
      on.forward(kSecond);
      on.backward(kFirst);
    }
    // 6. Backwards of both chunks. The later half are split: their weight grads
    //    fill phase 7, where the rank waits on grads from rank r+1, or run last.
    for (int k = 0; k < 2 * (r + 1); ++k) {
      const Chunk c = k % 2 == 0 ? kSecond : kFirst;
      if (k < r + 1)
        on.backward(c);
      else
        on.input_grad(c);
    }
    // 7. The last first-chunk backwards, each after a deferred weight grad.
    for (int i = 0; i < below; ++i) {
      on.weight_grad();
      on.input_grad(kFirst);
    }
    // 8. Cool-down: the r + 1 weight grads still deferred.
    while (on.has_deferred_weight_grads()) on.weight_grad();
  }
  return s;
}

}  // namespace hp::schedule
