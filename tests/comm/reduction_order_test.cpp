// Every shared-memory reduction folds ranks in rank order, x_0 + x_1 + ... + x_{n-1},
// accumulating bfloat16 in float32 and rounding once (symm/fold.h). Checked bit for bit on
// random floats of widely spread magnitudes, whose sums depend on the order (small
// integers' do not), at 3 and 4 ranks, on every path: all-reduce in one step, through the
// windows, staged in the heap and in place in the heap; reduce-scatter through the
// windows, in place in the heap, and from pieces that lie anywhere. The hierarchical
// all-reduce and reduce-scatter (2 hosts of 3 ranks) fold each host in local rank order,
// then add the hosts' results: checked against that order.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "hp/comm.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/symm/collectives.h"
#include "hp/comm/symm/symm.h"
#include "scoped_env.h"

using namespace hp;
using namespace hp::comm;

namespace {

constexpr int64_t kNumel = 40000;  // 160 KB of float32: many 16 KiB steps

// Magnitudes from 2^-30 to 2^30, whose sums round in ways that depend on the order. And
// at every 4th element x_0 = +-2^20 = -x_1: folded from rank 0 up these cancel first and
// the smaller terms survive whole, while any order that adds a smaller term to 2^20 first
// rounds it away. The float32 sums of a few bfloat16 values are mostly exact in any order:
// there, the cancellation is what tells orders apart.
std::vector<at::Tensor> spread_inputs(int n, at::ScalarType dtype) {
  at::manual_seed(1234);
  std::vector<at::Tensor> xs;
  for (int r = 0; r < n; ++r)
    xs.push_back(at::randn({kNumel}) * at::pow(2.0, at::randint(-30, 30, {kNumel}).to(at::kFloat)));
  at::Tensor big = at::where(at::rand({kNumel / 4}) < 0.5, -1.0f, 1.0f) * float(1 << 20);
  xs[0].slice(0, 0, kNumel, 4).copy_(big);
  if (n > 1) xs[1].slice(0, 0, kNumel, 4).copy_(-big);
  for (auto& x : xs) x = x.to(dtype);
  return xs;
}

// x_first + x_{first+1} + ... in that order, in float32, rounded once to the inputs' dtype.
at::Tensor fold(const std::vector<at::Tensor>& xs, int first, int count) {
  at::Tensor acc = xs[first].to(at::kFloat);
  for (int r = first + 1; r < first + count; ++r) acc = acc + xs[r].to(at::kFloat);
  return acc.to(xs[first].scalar_type());
}

// The inputs tell the orders apart: folded backwards, they give other bits.
void expect_order_matters(const std::vector<at::Tensor>& xs) {
  std::vector<at::Tensor> backwards(xs.rbegin(), xs.rend());
  ASSERT_FALSE(at::equal(fold(xs, 0, int(xs.size())), fold(backwards, 0, int(xs.size()))));
}

void expect_bits(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(at::equal(got, want)) << what << ": " << at::ne(got, want).sum().item<int64_t>() << " of "
                                    << want.numel() << " elements differ from the rank-order fold";
}

// This rank's part of a reduce-scatter of kNumel elements (hp::comm::chunk_sizes).
at::Tensor my_part(const at::Tensor& whole, int n, int rank) {
  const auto sizes = chunk_sizes(kNumel, n);
  int64_t off = 0;
  for (int r = 0; r < rank; ++r) off += sizes[r];
  return whole.narrow(0, off, sizes[rank]);
}

TEST(ShmReductionOrder, EveryPathFoldsInRankOrder) {
  ScopedEnv step("HP_SHM_STEP_KIB", "16");  // one step up to 16 KiB, staged from 64 KiB
  for (const char* staging : {"0", "1"}) {  // private all-reduces through the windows, or staged
    ScopedEnv env("HP_SHM_STAGING", staging);
    const std::string all_reduce_path = std::string("all_reduce ") + (*staging == '0' ? "windows" : "staged");
    for (int n : {3, 4}) {
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        const std::vector<at::Tensor> xs = spread_inputs(n, dtype);
        expect_order_matters(xs);
        const at::Tensor want = fold(xs, 0, n);
        run_local_ranks(n, [&](int rank) {
          auto g = current_world()->world_group();
          auto h = symm::group_heap(*g);
          const std::string where = ", " + std::to_string(n) + " ranks, " + c10::toString(dtype);
          auto in_heap = [&](const at::Tensor& t) { return symm::empty(t.sizes(), dtype, *g).copy_(t); };

          at::Tensor x = xs[rank].clone();
          all_reduce_(x, *g);
          expect_bits(x, want, all_reduce_path + where);
          if (*staging == '1') return;  // the other paths do not depend on staging

          x = xs[rank].narrow(0, 0, 1000).clone();
          all_reduce_(x, *g);
          expect_bits(x, want.narrow(0, 0, 1000), "all_reduce in one step" + where);

          x = in_heap(xs[rank]);
          all_reduce_(x, *g);
          expect_bits(x, want, "all_reduce in the heap" + where);

          expect_bits(reduce_scatter(xs[rank], *g), my_part(want, n, rank), "reduce_scatter windows" + where);
          expect_bits(reduce_scatter(in_heap(xs[rank]), *g), my_part(want, n, rank),
                      "reduce_scatter in the heap" + where);

          // The pieces overload, pieces in reverse order in a private buffer.
          const auto sizes = chunk_sizes(kNumel, n);
          at::Tensor scattered = at::empty({kNumel}, dtype);
          std::vector<const char*> pieces(n);
          for (int r = 0, from = 0, to = int(kNumel); r < n; from += int(sizes[r]), ++r) {
            to -= int(sizes[r]);
            scattered.narrow(0, to, sizes[r]).copy_(xs[rank].narrow(0, from, sizes[r]));
            pieces[r] = static_cast<const char*>(scattered.data_ptr()) + to * scattered.element_size();
          }
          at::Tensor out = at::empty({sizes[rank]}, dtype);
          symm::reduce_scatter(*h, pieces, sizes, out.data_ptr(), dtype, ReduceOp::Sum);
          expect_bits(out, my_part(want, n, rank), "reduce_scatter of pieces" + where);
        });
      }
    }
  }
}

TEST(ShmReductionOrder, HierarchicalFoldsEachHostInRankOrderThenTheHosts) {
  ScopedEnv pieces("HP_HIER_PIECE_KIB", "16");
  constexpr int kHosts = 2, kPerHost = 3, n = kHosts * kPerHost;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const std::vector<at::Tensor> xs = spread_inputs(n, dtype);
    expect_order_matters(std::vector<at::Tensor>(xs.begin(), xs.begin() + kPerHost));
    // Two hosts' results add the same in either order; each is rounded to dtype first.
    const at::Tensor want = (fold(xs, 0, kPerHost).to(at::kFloat) + fold(xs, kPerHost, kPerHost).to(at::kFloat)).to(dtype);
    run_local_ranks(
        n,
        [&](int rank) {
          auto g = current_world()->world_group();
          hier::ScopedMode on(hier::Mode::On);
          const std::string where = std::string(", ") + c10::toString(dtype);
          const int64_t before = hier::calls_on_this_thread();
          expect_bits(all_reduce(xs[rank], *g), want, "hierarchical all_reduce" + where);
          expect_bits(reduce_scatter(xs[rank], *g), my_part(want, n, rank), "hierarchical reduce_scatter" + where);
          EXPECT_EQ(hier::calls_on_this_thread(), before + 2);
        },
        std::chrono::seconds(60), kPerHost);
  }
}

}  // namespace
