// When a collective runs hierarchically: the topology's cost model decides.
#include <cstdlib>
#include <string>

#include "hp/base/error.h"
#include "hp/comm/hier/hier.h"
#include "hp/comm/symm/collectives.h"
#include "hp/topology/hierarchical.h"

namespace hp::comm::hier {
namespace {

thread_local std::optional<Mode> t_mode;
thread_local int64_t t_calls = 0;

}  // namespace

Mode mode() {
  if (t_mode) return *t_mode;
  const char* v = std::getenv("HP_HIER_COLLECTIVES");  // read each time: benchmarks flip it
  const std::string s = v ? v : "";
  return s == "0" ? Mode::Off : s == "1" ? Mode::On : Mode::Auto;
}

ClusterTopology host_topology(int world_size, int ranks_per_host) {
  // Rough figures for a server: shared-memory copies at ~10 GB/s per rank with ~5 us per
  // barrier; a 10 Gbit/s network with ~50 us per message. They only need to rank the two
  // algorithms, and the hierarchical one moves fewer bytes over the slower level.
  const int hosts = (world_size + ranks_per_host - 1) / ranks_per_host;
  return ClusterTopology({LinkLevel{"host", ranks_per_host, 10.0, 5.0}, LinkLevel{"network", hosts, 1.25, 50.0}});
}

size_t piece_bytes() {
  const char* v = std::getenv("HP_HIER_PIECE_KIB");
  if (!v || !*v) return size_t{4} << 20;
  char* end = nullptr;
  const long long kib = std::strtoll(v, &end, 10);
  HP_CHECK(end && *end == '\0' && kib >= 1) << "HP_HIER_PIECE_KIB must be a positive integer, got '" << v << "'";
  return static_cast<size_t>(kib) << 10;
}

bool chosen(const Group& g, Collective kind, int64_t bytes, at::ScalarType dtype) {
  const Mode m = mode();
  if (m == Mode::Off || g.device() != "cpu" || g.size() < 4 || !g.topology() || bytes <= 0) return false;
  if (kind != Collective::AllGather && !symm::can_reduce(dtype)) return false;
  if (kind == Collective::AllReduce && dtype == at::kShort) return false;  // Gloo cannot reduce it across hosts
  auto blocks = host_blocks(*g.topology(), g.ranks());
  if (!blocks || blocks->per_host > symm::kMaxRanks) return false;
  return m == Mode::On || choose_algorithm(*g.topology(), kind, static_cast<double>(bytes), g.ranks(),
                          static_cast<double>(piece_bytes())) == CollectiveAlgorithm::Hierarchical;
}

ScopedMode::ScopedMode(Mode m) : previous_(t_mode) { t_mode = m; }
ScopedMode::~ScopedMode() { t_mode = previous_; }

int64_t calls_on_this_thread() { return t_calls; }

void detail::count_call() { ++t_calls; }

}  // namespace hp::comm::hier
