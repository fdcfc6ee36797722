// How a tensor lies along one mesh dim: split on a tensor dim (Shard), a full copy on
// every rank (Replicate), or a per-rank term of a pending reduction (Partial).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "hp/base/reduce_op.h"

namespace hp {

class Placement {
 public:
  enum class Kind : uint8_t { Shard, Replicate, Partial };

  Placement() = default;  // Replicate
  static Placement shard(int dim);
  static Placement replicate() { return Placement(); }
  static Placement partial(ReduceOp op = ReduceOp::Sum);

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::Shard; }
  bool is_shard(int dim) const { return kind_ == Kind::Shard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::Replicate; }
  bool is_partial() const { return kind_ == Kind::Partial; }
  int dim() const;        // Shard only
  ReduceOp op() const;    // Partial only

  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && dim_ == o.dim_ && op_ == o.op_;
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  bool operator<(const Placement& o) const;
  size_t hash() const;
  std::string to_string() const;  // "S(0)", "R", "P(sum)"

 private:
  Kind kind_ = Kind::Replicate;
  int dim_ = 0;                 // 0 unless Shard, so == and hash need no special cases
  ReduceOp op_ = ReduceOp::Sum;  // Sum unless Partial
};

Placement Shard(int dim);
Placement Replicate();
// Partial(op) for op in {Sum, Avg, Max, Min}; Product has no cheap Replicate -> Partial.
Placement Partial(ReduceOp op = ReduceOp::Sum);

std::ostream& operator<<(std::ostream& os, const Placement& p);

}  // namespace hp

template <>
struct std::hash<hp::Placement> {
  size_t operator()(const hp::Placement& p) const { return p.hash(); }
};
