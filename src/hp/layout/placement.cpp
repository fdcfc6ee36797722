#include "hp/layout/placement.h"

#include <ostream>
#include <tuple>

#include "hp/base/error.h"

namespace hp {

Placement Placement::shard(int dim) {
  Placement p;
  p.kind_ = Kind::Shard;
  p.dim_ = dim;
  return p;
}

Placement Placement::partial(ReduceOp op) {
  HP_CHECK(op != ReduceOp::Product)
      << "Partial supports sum, avg, max and min; found " << hp::to_string(op);
  Placement p;
  p.kind_ = Kind::Partial;
  p.op_ = op;
  return p;
}

int Placement::dim() const {
  HP_CHECK(is_shard()) << "dim() asked of placement " << to_string() << ", expected a Shard";
  return dim_;
}

ReduceOp Placement::op() const {
  HP_CHECK(is_partial()) << "op() asked of placement " << to_string() << ", expected a Partial";
  return op_;
}

bool Placement::operator<(const Placement& o) const {
  return std::make_tuple(kind_, dim_, op_) < std::make_tuple(o.kind_, o.dim_, o.op_);
}

size_t Placement::hash() const {
  return (static_cast<size_t>(kind_) * 1000003u) ^ (static_cast<size_t>(dim_ + 7) * 8191u) ^
         static_cast<size_t>(op_);
}

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::Shard: return "S(" + std::to_string(dim_) + ")";
    case Kind::Replicate: return "R";
    case Kind::Partial: return std::string("P(") + hp::to_string(op_) + ")";
  }
  return "?";
}

Placement Shard(int dim) { return Placement::shard(dim); }
Placement Replicate() { return Placement::replicate(); }
Placement Partial(ReduceOp op) { return Placement::partial(op); }

std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << p.to_string(); }

}  // namespace hp
