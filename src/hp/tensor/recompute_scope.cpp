#include "hp/tensor/recompute_scope.h"

namespace hp {
namespace {
thread_local bool t_recomputing = false;
}  // namespace

bool recomputing() { return t_recomputing; }

RecomputeScope::RecomputeScope() : outer_(t_recomputing) { t_recomputing = true; }

RecomputeScope::~RecomputeScope() { t_recomputing = outer_; }

}  // namespace hp
