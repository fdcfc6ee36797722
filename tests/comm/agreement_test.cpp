// Ranks whose calls over shared memory differ fail together (hp/comm/symm/agreement.h):
// every collective path, small (windows) and large (in place, staged), with sizes, reduce
// op, dtype, root or the collective itself differing on one rank of three; and
// hp::symm::empty with offsets or sizes that differ. Each is an error on every rank naming
// what each rank passed, not a silent pairing or a hang; the next matching call works.
// The group's timeout is short: without the check, some of these would wait for it.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/symm.h"
#include "scoped_env.h"

using namespace hp;
using namespace hp::comm;

namespace {

constexpr int kWorld = 3;

struct Mismatch {
  const char* name;
  // Called on every rank; rank 2 passes something else.
  std::function<void(int rank, const Group& g)> call;
  // What every rank's error names.
  std::vector<std::string> named;
};

// 1000 floats: one step through the windows; 300,000 (1.2 MB): several steps, in place or
// staged where the buffers allow.
at::Tensor floats(int64_t n) { return at::ones({n}); }

std::vector<Mismatch> mismatches() {
  const int64_t big = 300000;
  auto odd = [](int rank) { return rank == 2; };
  return {
      {"all_reduce sizes, one step",
       [=](int r, const Group& g) { all_reduce_(floats(odd(r) ? 1016 : 1000), g); },
       {"group ranks [0, 1] made call", "all_reduce (sum, Float) of 4000 bytes", "group rank 2 made",
        "of 4064 bytes"}},
      {"all_reduce sizes, many steps",
       [=](int r, const Group& g) { all_reduce_(floats(odd(r) ? big + 16 : big), g); },
       {"of 1200000 bytes", "of 1200064 bytes"}},
      {"all_reduce sizes, in the heap",
       [=](int r, const Group& g) {
         at::Tensor t = symm::empty({big + 16}, at::kFloat, g).fill_(1);
         all_reduce_(t.narrow(0, 0, odd(r) ? big + 16 : big), g);
       },
       {"of 1200000 bytes", "of 1200064 bytes"}},
      {"all_reduce reduce op",
       [=](int r, const Group& g) { all_reduce_(floats(1000), g, odd(r) ? ReduceOp::Max : ReduceOp::Sum); },
       {"all_reduce (sum, Float)", "all_reduce (max, Float)"}},
      {"all_reduce dtype",
       [=](int r, const Group& g) { all_reduce_(at::ones({1000}, odd(r) ? at::kInt : at::kFloat), g); },
       {"all_reduce (sum, Float)", "all_reduce (sum, Int)"}},
      {"broadcast root, one step",
       [=](int r, const Group& g) { broadcast_(floats(1000), g, odd(r) ? 1 : 0); },
       {"broadcast of 4000 bytes from group rank 0", "broadcast of 4000 bytes from group rank 1"}},
      {"broadcast sizes, many steps",
       [=](int r, const Group& g) { broadcast_(floats(odd(r) ? big + 16 : big), g, 0); },
       {"broadcast of 1200000 bytes", "broadcast of 1200064 bytes"}},
      {"all_gather sizes, windows",
       [=](int r, const Group& g) {
         std::vector<int64_t> sizes{100, odd(r) ? 116 : 100, 100};
         all_gather(floats(sizes[r]), g, 0, sizes);
       },
       {"all_gather of 1200 bytes, bytes per rank [400, 400, 400]",
        "all_gather of 1264 bytes, bytes per rank [400, 464, 400]"}},
      {"reduce_scatter sizes, windows",
       [=](int r, const Group& g) {
         std::vector<int64_t> sizes{100, odd(r) ? 116 : 100, odd(r) ? 84 : 100};
         reduce_scatter(floats(300), g, 0, ReduceOp::Sum, sizes);
       },
       {"reduce_scatter (sum, Float) of 1200 bytes, elements per rank [100, 100, 100]",
        "elements per rank [100, 116, 84]"}},
      {"reduce_scatter reduce op, in the heap",
       [=](int r, const Group& g) {
         at::Tensor t = symm::empty({big}, at::kFloat, g).fill_(1);
         reduce_scatter(t, g, 0, odd(r) ? ReduceOp::Avg : ReduceOp::Sum);
       },
       {"reduce_scatter (sum, Float)", "reduce_scatter (avg, Float)"}},
      {"another collective",
       [=](int r, const Group& g) {
         if (odd(r)) broadcast_(floats(1000), g, 0);
         else all_reduce_(floats(1000), g);
       },
       {"all_reduce (sum, Float) of 4000 bytes", "broadcast of 4000 bytes from group rank 0"}},
      {"all_to_all against all_reduce",
       [=](int r, const Group& g) {
         if (odd(r)) all_to_all(floats(999), g, 0, 0);
         else all_reduce_(floats(999), g);
       },
       {"all_to_all", "all_reduce (sum, Float) of 3996 bytes"}},
      {"a barrier against a collective",
       [=](int r, const Group& g) {
         if (odd(r)) symm::barrier(g);
         else all_reduce_(floats(1000), g);
       },
       {"hp::symm::barrier", "all_reduce (sum, Float) of 4000 bytes"}},
      {"an empty message on one rank",
       [=](int r, const Group& g) { all_reduce_(floats(odd(r) ? 0 : 1000), g); },
       {"all_reduce (sum, Float) of 0 bytes", "all_reduce (sum, Float) of 4000 bytes"}},
      {"hp::symm::empty sizes",
       [=](int r, const Group& g) { symm::empty({odd(r) ? 1016 : 1000}, at::kFloat, g); },
       {"hp::symm::empty of 4000 bytes at offset 0", "hp::symm::empty of 4064 bytes at offset 0"}},
      {"hp::symm::empty offsets",
       [=](int r, const Group& g) {
         auto h = symm::group_heap(g);
         // Rank 2 holds one more allocation: its next tensor lands further on.
         const size_t extra = odd(r) ? h->allocate(256) : 0;
         try {
           symm::empty({1000}, at::kFloat, g);
         } catch (...) {
           if (odd(r)) h->release(extra);
           throw;
         }
       },
       {"hp::symm::empty of 4000 bytes at offset 0", "hp::symm::empty of 4000 bytes at offset 256"}},
      {"hp::symm::empty without room on one rank",
       [=](int r, const Group& g) {
         auto h = symm::group_heap(g);
         symm::empty({odd(r) ? int64_t(h->user_bytes()) + 1 : 1000}, at::kByte, g);
       },
       {"hp::symm::empty of 1000 bytes at offset 0", "with no room in its heap"}},
  };
}

TEST(ShmAgreement, CallsThatDifferFailOnEveryRankNamingWhatEachPassed) {
  ScopedEnv small("HP_SHM_STEP_KIB", "64");  // 1.2 MB takes many steps
  for (const Mismatch& m : mismatches()) {
    run_local_ranks(
        kWorld,
        [&](int rank) {
          auto g = current_world()->world_group();
          try {
            m.call(rank, *g);
            ADD_FAILURE() << m.name << ": no error on rank " << rank;
          } catch (const hp::Error& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("the ranks' calls differ"), std::string::npos) << m.name << ": " << what;
            for (const auto& s : m.named) EXPECT_NE(what.find(s), std::string::npos) << m.name << ": " << what;
          }
          // The ranks are in step again: a call that matches pairs up and is right.
          at::Tensor t = at::full({1000}, float(rank));
          all_reduce_(t, *g);
          EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0f))) << m.name << ", rank " << rank;
        },
        std::chrono::seconds(5));
  }
}

// Every rank allocates the same offsets as long as all allocate and free in the same
// order; a rank whose tensor is still alive where its peers' are freed is caught at the
// next allocation rather than later as a put into the wrong place.
TEST(ShmAgreement, SymmetricAllocationsStayInStep) {
  run_local_ranks(kWorld, [&](int rank) {
    auto g = current_world()->world_group();
    at::Tensor kept;
    for (int i = 0; i < 2; ++i) {
      at::Tensor a = symm::empty({1000 + 16 * i}, at::kFloat, *g);
      if (i == 1 && rank == 0) kept = a;  // outlives its peers' twins
    }
    try {
      symm::empty({4000}, at::kFloat, *g);
      ADD_FAILURE() << "no error on rank " << rank;
    } catch (const hp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("group rank 0 made"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("group ranks [1, 2] made"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
