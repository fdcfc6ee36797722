#include "hp/comm/transport.h"

#include <cstdlib>
#include <string>

#include "hp/comm/hier/hier.h"
#include "hp/comm/symm/collectives.h"

namespace hp::comm {

const char* to_string(Transport t) {
  switch (t) {
    case Transport::Local: return "local";
    case Transport::Hierarchical: return "hierarchical";
    case Transport::SharedMemory: return "shared memory";
    case Transport::Gloo: return "gloo";
  }
  return "?";
}

Transport choose_transport(const Group& g, Collective kind, int64_t bytes, at::ScalarType dtype) {
  if (g.size() == 1) return Transport::Local;
  const bool hier_kind =
      kind == Collective::AllReduce || kind == Collective::AllGather || kind == Collective::ReduceScatter;
  if (hier_kind && hier::chosen(g, kind, bytes, dtype)) return Transport::Hierarchical;
  const bool reduces = kind == Collective::AllReduce || kind == Collective::ReduceScatter;
  if (symm::shm_collectives_enabled(g) && (!reduces || symm::can_reduce(dtype))) return Transport::SharedMemory;
  return Transport::Gloo;
}

bool async_engine_enabled() {
  const char* v = std::getenv("HP_ASYNC_COLLECTIVES");
  return !(v && std::string(v) == "0");
}

}  // namespace hp::comm
