#include "hp/tensor/op_observer.h"

namespace hp {
namespace {

thread_local OpObserver* t_observer = nullptr;
thread_local int t_depth = 0;

}  // namespace

bool ObservedOp::communicates() const {
  if (collective) return true;
  if (op || !from || !to) return false;
  for (int k = 0; k < static_cast<int>(from->placements().size()); ++k) {
    const Placement& a = from->placement(k);
    const Placement& b = to->placement(k);
    if (!(a == b) && !a.is_replicate()) return true;  // from Replicate: a local slice
  }
  return false;
}

std::string ObservedOp::name() const {
  if (collective) return collective;
  if (op) return op->to_string();
  return "redistribute " + (from ? from->to_string() : "?") + " -> " + (to ? to->to_string() : "?");
}

ScopedOpObserver::ScopedOpObserver(OpObserver* observer) : previous_(t_observer) { t_observer = observer; }
ScopedOpObserver::~ScopedOpObserver() { t_observer = previous_; }

bool observing() { return t_observer != nullptr; }
OpObserver* op_observer() { return t_observer; }

at::Tensor observe_op(const ObservedOp& op, const std::function<at::Tensor()>& compute) {
  if (!t_observer || t_depth > 0) return compute();
  struct Depth {
    Depth() { ++t_depth; }
    ~Depth() { --t_depth; }
  } depth;
  return t_observer->run(op, compute);
}

at::Tensor observe_collective(const char* name, const at::Tensor& input, const std::function<at::Tensor()>& compute) {
  const std::vector<at::Tensor> inputs{input};
  ObservedOp op;
  op.inputs = &inputs, op.collective = name;
  return observe_op(op, compute);
}

}  // namespace hp
