// Redistribution: bytes moved and time of the min-cost plan against PyTorch's
// per-mesh-dim plan, same pairs, same run; and the cost of one cached DTensor op
// dispatch against the bare ATen op. Run: hprun --nproc-per-node 4 build/bin/bench_redistribute
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hp/tensor.h"

using namespace hp;

namespace {

double seconds_since(std::chrono::steady_clock::time_point s) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
}

// Median seconds of `a` and `b`, alternating, slowest rank.
std::pair<double, double> median_pair(const comm::Group& g, int iters, const std::function<void()>& a,
                                      const std::function<void()>& b) {
  a();
  b();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i)
    for (const auto* op : {&a, &b}) {
      comm::barrier(g);
      auto s = std::chrono::steady_clock::now();
      (*op)();
      t.push_back(seconds_since(s));
    }
  at::Tensor v = at::tensor(t, at::kDouble);
  comm::all_reduce_(v, g, ReduceOp::Max);
  auto median = [&](int k) {
    std::vector<double> m;
    for (int i = 0; i < iters; ++i) m.push_back(v[2 * i + k].item<double>());
    std::nth_element(m.begin(), m.begin() + iters / 2, m.end());
    return m[iters / 2];
  };
  return {median(0), median(1)};
}

void bench_pairs(const DeviceMesh& mesh, const std::vector<std::pair<std::vector<Placement>, std::vector<Placement>>>& pairs,
                 const std::vector<int64_t>& shape) {
  const bool lead = mesh.rank() == 0;
  for (const auto& [a, b] : pairs) {
    ShardSpec from = make_spec(shape, at::kFloat, mesh, a), to = make_spec(shape, at::kFloat, mesh, b);
    RedistributePlan ours = min_cost_plan(from, to), base = per_mesh_dim_plan(from, to);
    manual_seed(0);
    DTensor x = hp::randn(shape, mesh, std::vector<Placement>(mesh.ndim(), Replicate())).redistribute(a);
    const at::Tensor& local = x.to_local();
    auto t = median_pair(mesh.whole_group(), 7, [&] { execute_plan(local, base, mesh); },
                         [&] { execute_plan(local, ours, mesh); });
    if (lead)
      std::printf("%-22s %-22s %9.1f %9.1f %6.2fx %9.2f %9.2f %6.2fx   %s\n", to_string_list(a).c_str(),
                  to_string_list(b).c_str(), base.cost.total_bytes() / 1e6, ours.cost.total_bytes() / 1e6,
                  base.cost.total_bytes() / std::max(1.0, ours.cost.total_bytes()), t.first * 1e3, t.second * 1e3,
                  t.first / t.second, ours.to_string().c_str());
  }
}

}  // namespace

int main() {
  init_distributed();
  const std::vector<int64_t> shape{1024, 1024};  // float32: 4 MiB
  auto flat = init_device_mesh("cpu", {4}, {"x"});
  auto grid = init_device_mesh("cpu", {2, 2}, {"a", "b"});
  if (flat.rank() == 0) {
    std::printf("# tensor [1024, 1024] float32 on 4 ranks; bytes moved (MB, all ranks) and median ms\n");
    std::printf("%-22s %-22s %9s %9s %7s %9s %9s %7s   %s\n", "from", "to", "base MB", "ours MB", "ratio",
                "base ms", "ours ms", "ratio", "our plan");
  }
  bench_pairs(flat,
              {{{Shard(0)}, {Shard(1)}}, {{Shard(0)}, {Replicate()}}, {{Partial()}, {Shard(0)}},
               {{Partial()}, {Replicate()}}, {{Replicate()}, {Shard(1)}}, {{Shard(1)}, {Partial()}}},
              shape);
  bench_pairs(grid,
              {{{Shard(0), Shard(1)}, {Shard(1), Shard(0)}},
               {{Replicate(), Shard(0)}, {Shard(1), Shard(1)}},
               {{Shard(0), Replicate()}, {Replicate(), Shard(0)}},
               {{Shard(0), Shard(0)}, {Shard(1), Shard(1)}},
               {{Partial(), Shard(0)}, {Shard(0), Shard(1)}},
               {{Shard(0), Shard(1)}, {Replicate(), Replicate()}},
               {{Partial(), Partial()}, {Shard(0), Shard(1)}}},
              shape);

  // Dispatch overhead: a cached DTensor op on a tiny tensor against the bare ATen op.
  DTensor a = distribute_tensor(at::ones({4, 4}), grid, {Shard(0), Replicate()});
  DTensor b = distribute_tensor(at::ones({4, 4}), grid, {Shard(0), Replicate()});
  at::Tensor la = a.to_local(), lb = b.to_local();
  const int n = 20000;
  std::vector<double> bare, ours;
  for (int rep = 0; rep < 5; ++rep) {
    auto s = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) at::add(la, lb);
    bare.push_back(seconds_since(s) / n);
    s = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) add(a, b);
    ours.push_back(seconds_since(s) / n);
  }
  std::sort(bare.begin(), bare.end());
  std::sort(ours.begin(), ours.end());
  if (grid.rank() == 0)
    std::printf("\n# dispatch, tiny [4, 4] add on a 2x2 mesh: bare ATen %.2f us, DTensor %.2f us, overhead %.2f us\n",
                bare[2] * 1e6, ours[2] * 1e6, (ours[2] - bare[2]) * 1e6);
  return 0;
}
