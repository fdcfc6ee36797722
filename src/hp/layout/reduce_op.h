// The reduction of a Partial placement and of reducing collectives. Shared with the
// comm layer, so it lives apart from Placement.
#pragma once

namespace hp {

enum class ReduceOp { Sum, Avg, Max, Min, Product };

inline const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

}  // namespace hp
