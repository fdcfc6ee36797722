// What a DTensor op costs over the same ATen op on the local tensors, per call: the
// sharding rule, the plan cache lookup and the wrapping of the result. The inputs already
// have the layouts the rule wants, so nothing is communicated. Ops on tensors that require
// grad (autograd records a node for both) and on tensors that do not; a small and a
// medium shape; bare and DTensor calls alternate in every round.
//   build/bin/hprun --nproc-per-node 4 build/bin/bench_dispatch [calls] [rounds]
// With 4 ranks the mesh is 2 x 2 (inputs [Shard(0), Replicate()], the weight of matmul
// replicated), as in the first dispatch figure; otherwise 1-D over the ranks. Rank 0
// reports its own times (each rank dispatches alone: there is no collective to wait for).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hp/base/error.h"
#include "hp/tensor.h"

using namespace hp;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds per call of `bare` and `ours` over `rounds` rounds of `calls` calls each,
// alternating.
std::pair<double, double> per_call(int calls, int rounds, const std::function<void()>& bare,
                                   const std::function<void()>& ours) {
  for (int i = 0; i < 100; ++i) bare(), ours();  // warm-up: caches, allocator
  std::vector<double> a, b;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now_s();
    for (int i = 0; i < calls; ++i) bare();
    a.push_back((now_s() - t0) / calls);
    t0 = now_s();
    for (int i = 0; i < calls; ++i) ours();
    b.push_back((now_s() - t0) / calls);
  }
  std::nth_element(a.begin(), a.begin() + rounds / 2, a.end());
  std::nth_element(b.begin(), b.begin() + rounds / 2, b.end());
  return {a[rounds / 2], b[rounds / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  HP_CHECK(calls > 0 && rounds > 0) << "bench_dispatch: calls and rounds must be > 0";
  auto world = init_distributed();
  const int n = world->size();
  const bool grid = n == 4;
  DeviceMesh mesh = grid ? init_device_mesh("cpu", {2, 2}, {"a", "b"}) : init_device_mesh("cpu", {n}, {"a"});
  const std::vector<Placement> rows = grid ? std::vector<Placement>{Shard(0), Replicate()} : std::vector<Placement>{Shard(0)};
  const std::vector<Placement> whole(mesh.ndim(), Replicate());
  if (mesh.rank() == 0) {
    std::printf("# DTensor dispatch against the bare ATen op on the local tensors, mesh %s, %d calls x %d rounds, "
                "median us per call (rank 0)\n",
                mesh.shape().to_string().c_str(), calls, rounds);
    std::printf("%-8s %-12s %6s %10s %10s %10s %8s\n", "op", "shape", "grad", "ATen us", "DTensor us", "overhead",
                "ratio");
  }
  std::vector<std::string> results;
  for (int64_t size : {4, 128}) {
    const int64_t rows_total = size * (grid ? 2 : n);  // every rank's piece is [size, size]
    for (bool grad : {false, true}) {
      DTensor a = distribute_tensor(at::randn({rows_total, size}), mesh, rows);
      DTensor b = distribute_tensor(at::randn({rows_total, size}), mesh, rows);
      DTensor w = distribute_tensor(at::randn({size, size}), mesh, whole);
      for (DTensor* t : {&a, &b, &w}) t->requires_grad_(grad);
      at::Tensor la = a.to_local(), lb = b.to_local(), lw = w.to_local();
      const std::vector<std::pair<std::string, std::pair<std::function<void()>, std::function<void()>>>> ops{
          {"add", {[&] { at::add(la, lb); }, [&] { add(a, b); }}},
          {"matmul", {[&] { at::matmul(la, lw); }, [&] { matmul(a, w); }}}};
      for (const auto& [name, fns] : ops) {
        const auto [bare, ours] = per_call(calls, rounds, fns.first, fns.second);
        if (mesh.rank() != 0) continue;
        const std::string shape = "[" + std::to_string(size) + ", " + std::to_string(size) + "]";
        std::printf("%-8s %-12s %6s %10.2f %10.2f %10.2f %7.2fx\n", name.c_str(), shape.c_str(), grad ? "yes" : "no",
                    bare * 1e6, ours * 1e6, (ours - bare) * 1e6, ours / bare);
        char line[128];
        std::snprintf(line, sizeof line, "RESULT dispatch_overhead_us_%s_%lld%s %.2f", name.c_str(), (long long)size,
                      grad ? "_grad" : "", (ours - bare) * 1e6);
        results.push_back(line);
      }
    }
  }
  for (const auto& line : results) std::printf("%s\n", line.c_str());
  return 0;
}
