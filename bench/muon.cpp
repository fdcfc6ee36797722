// Distributed Muon's Newton-Schulz work spread three ways over the ranks of a job, taking
// turns: every matrix whole on one owner (MuonSplit::None), the largest split in blocks
// over all ranks where that shortens the busiest rank's work (Balanced), and every matrix
// split (All); and whole owners with one exchange each way around all the work instead of
// rounds whose exchanges overlap the next round's compute (MuonOptions::overlap = false).
// The matrices are sharded by rows (Shard(0)), as fully_shard leaves them.
//   build/bin/hprun --nproc-per-node N build/bin/bench_muon [steps] [rounds] [ROWSxCOLS,...]
// Default: the three 1408 x 512 MLP matrices of one block of a dim-512 model, fewer than
// the ranks of most jobs. With more ranks than cores the split cannot beat whole owners
// (the same work on the same cores): run with at most one rank per core.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "hp/base/error.h"
#include "hp/base/strings.h"
#include "hp/comm/collectives.h"
#include "hp/optim/muon.h"
#include "hp/tensor/random.h"

using namespace hp;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string spec = argc > 3 ? argv[3] : "1408x512,512x1408,1408x512";
  HP_CHECK(steps > 0 && rounds > 0) << "bench_muon: steps and rounds must be > 0";
  comm::init_distributed();
  const int64_t world = comm::current_world()->size();
  DeviceMesh mesh = init_device_mesh("cpu", {world}, {"dp"});
  std::vector<std::vector<int64_t>> shapes;
  for (const std::string& s : split(spec, ',')) {
    auto rc = split(s, 'x');
    HP_CHECK(rc.size() == 2) << "bench_muon: '" << s << "' is not ROWSxCOLS";
    shapes.push_back({std::stoll(rc[0]), std::stoll(rc[1])});
  }
  manual_seed(5);
  std::vector<DTensor> weights;
  for (const auto& s : shapes) {
    weights.push_back(randn(s, mesh, {Shard(0)}));
    weights.back().to_local().mutable_grad() = randn(s, mesh, {Shard(0)}).to_local();
  }
  std::vector<DTensor*> params;
  for (DTensor& w : weights) params.push_back(&w);

  struct Mode {
    std::string name;
    optim::MuonSplit split;
    bool overlap;
  };
  const std::vector<Mode> modes{{"whole", optim::MuonSplit::None, true},
                                {"balanced", optim::MuonSplit::Balanced, true},
                                {"all", optim::MuonSplit::All, true},
                                {"whole-1x", optim::MuonSplit::None, false}};
  std::map<std::string, std::vector<double>> ms;
  std::map<std::string, int> split_count;
  for (int round = 0; round < rounds; ++round)
    for (const auto& [name, how, overlap] : modes) {
      optim::MuonOptions o;
      o.split = how;
      o.overlap = overlap;
      optim::Muon muon(params, o);
      split_count[name] = 0;
      for (size_t i = 0; i < params.size(); ++i) split_count[name] += muon.owner(i) == -1;
      for (int step = 0; step < steps + 1; ++step) {
        comm::barrier(mesh.group(0));
        const auto t0 = std::chrono::steady_clock::now();
        muon.step();
        comm::barrier(mesh.group(0));  // the step is as long as its busiest rank
        if (step > 0) ms[name].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  if (mesh.rank() != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%lld ranks, matrices %s, %d rounds x %d Muon steps\n", (long long)world, spec.c_str(), rounds, steps);
  std::printf("%-10s %8s %10s %10s\n", "mode", "split", "ms/step", "vs whole");
  const double whole = median(ms["whole"]);
  for (const auto& [name, how, overlap] : modes)
    std::printf("%-10s %8d %10.1f %9.2fx\n", name.c_str(), split_count[name], median(ms[name]), median(ms[name]) / whole);
  std::printf("RESULT muon_balanced_over_whole %.3f\n", median(ms["balanced"]) / whole);
  std::printf("RESULT muon_all_over_whole %.3f\n", median(ms["all"]) / whole);
  std::printf("RESULT muon_overlapped_over_one_exchange %.3f\n", whole / median(ms["whole-1x"]));
  return 0;
}
