// A program for the emulated-hosts test (under hprun on several hosts): hp's all_reduce,
// all_gather and reduce_scatter on the world group must run hierarchically and give what
// the flat algorithm gives with HP_HIER_COLLECTIVES=0, bit for bit on integer-valued data
// (several dtypes, messages of several pieces, uneven sizes). Prints
// "hier ok: <n> hierarchical calls, gloo on <address>, host <h>" when all holds.
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <numeric>

#include "comm/rank_data.h"
#include "hp/base/error.h"
#include "hp/comm.h"
#include "hp/comm/hier/hier.h"

using namespace hp;
using namespace hp::comm;

namespace {

// Every rank flips the knob at the same point of its collective sequence.
template <typename F>
at::Tensor flat(F&& f) {
  ::setenv("HP_HIER_COLLECTIVES", "0", 1);
  at::Tensor r = f();
  ::unsetenv("HP_HIER_COLLECTIVES");
  return r;
}

}  // namespace

int main() {
  try {
    auto world = init_distributed();
    auto g = world->world_group();
    const int n = g->size(), rank = g->rank();
    HP_CHECK(world->ranks_per_host() >= 2 && world->ranks_per_host() < n)
        << "hier_probe wants several hosts of 2 or more ranks; found " << world->ranks_per_host()
        << " ranks per host in a world of " << n;
    int64_t expected = 0;
    auto same = [&](const at::Tensor& h, const at::Tensor& f, const std::string& what) {
      ++expected;
      HP_CHECK(hier::calls_on_this_thread() == expected)
          << what << " did not run hierarchically (" << hier::calls_on_this_thread() << " hierarchical calls, "
          << expected << " expected)";
      HP_CHECK(at::equal(h, f)) << what << ": hierarchical and flat results differ";
    };
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      for (int64_t numel : {int64_t{1000}, int64_t{1} << 21}) {  // 2^21 floats: 2 pieces of 4 MiB
        at::Tensor x = rank_input(rank, {numel}, dtype);
        const std::string what = std::string(c10::toString(dtype)) + " of " + std::to_string(numel);
        same(all_reduce(x, *g), flat([&] { return all_reduce(x, *g); }), "all_reduce " + what);
        std::vector<int64_t> sizes(n);
        for (int r = 0; r < n; ++r) sizes[r] = numel / n - r * 7;  // uneven, adding up to less than numel
        at::Tensor part = x.narrow(0, 0, sizes[rank]);
        same(all_gather(part, *g, 0, sizes), flat([&] { return all_gather(part, *g, 0, sizes); }),
             "all_gather " + what);
        at::Tensor whole = x.narrow(0, 0, std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
        same(reduce_scatter(whole, *g, 0, ReduceOp::Sum, sizes),
             flat([&] { return reduce_scatter(whole, *g, 0, ReduceOp::Sum, sizes); }), "reduce_scatter " + what);
      }
    }
    std::cout << "hier ok: " << hier::calls_on_this_thread() << " hierarchical calls, gloo on "
              << world->gloo_address() << ", host " << world->host_of(world->rank()) << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
