// How a group that spans hosts splits into its host and the ranks of equal local index.
#include <memory>
#include <vector>

#include "hp/base/error.h"
#include "hp/comm/hier/hier.h"
#include "hp/topology/hierarchical.h"

namespace hp::comm::hier {

const HostLevels& host_levels(const Group& g) {
  auto lv = g.transport_state<HostLevels>([&g] {
    HP_CHECK(g.topology()) << g.describe() << ": hosts of its ranks unknown (a group made outside a World)";
    auto blocks = host_blocks(*g.topology(), g.ranks());
    HP_CHECK(blocks) << g.describe() << ": ranks are not equal consecutive blocks of 2 or more on 2 or more hosts";
    auto l = std::make_shared<HostLevels>();
    l->hosts = blocks->hosts;
    l->per_host = blocks->per_host;
    l->host = g.rank() / l->per_host;
    l->local = g.rank() % l->per_host;
    const auto& ranks = g.ranks();
    std::vector<int> inner(ranks.begin() + l->host * l->per_host, ranks.begin() + (l->host + 1) * l->per_host);
    std::vector<int> outer;
    for (int h = 0; h < l->hosts; ++h) outer.push_back(ranks[h * l->per_host + l->local]);
    // Inner first: its members are all here, creating it first too, so no rank waits on
    // one that is busy creating another group.
    l->inner = g.make_group(inner);
    l->outer = g.make_group(outer);
    return l;
  });
  return *lv;  // the group keeps it
}

}  // namespace hp::comm::hier
