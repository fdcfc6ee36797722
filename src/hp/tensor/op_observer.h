// The tensor ops a thread runs, seen from outside: every DTensor op's local kernel and
// every redistribution between two layouts runs through the thread's observer when one is
// set. Activation checkpointing records them in forward, and in its recompute hands back
// what it kept (a matmul's output, a collective's result) instead of running them again.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hp/layout/shard_spec.h"
#include "hp/layout/sharding_rules.h"

namespace hp {

struct ObservedOp {
  std::optional<Op> op;                 // a DTensor op's kernel; unset: a redistribution
  const ShardSpec* from = nullptr;      // a redistribution's layouts
  const ShardSpec* to = nullptr;
  const std::vector<at::Tensor>* inputs = nullptr;  // the local tensors it reads
  // A collective outside DTensor's layouts (a MoE token exchange): its name.
  const char* collective = nullptr;
  bool communicates() const;            // a redistribution that moves data between ranks, or a collective
  std::string name() const;             // "linear", "rms_norm", "redistribute P(sum) -> R", the collective's
};

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // Returns the op's output: compute()'s, or one kept from an earlier run.
  virtual at::Tensor run(const ObservedOp& op, const std::function<at::Tensor()>& compute) = 0;
};

// Sets this thread's observer until destroyed (the previous one resumes).
class ScopedOpObserver {
 public:
  explicit ScopedOpObserver(OpObserver* observer);
  ~ScopedOpObserver();
  ScopedOpObserver(const ScopedOpObserver&) = delete;
  ScopedOpObserver& operator=(const ScopedOpObserver&) = delete;

 private:
  OpObserver* previous_;
};

// Whether this thread's ops run through an observer (a selective checkpoint's forward or
// recompute): code that would run some of them inside another observed op, where the
// observer cannot see them, runs them on their own instead.
bool observing();
// The thread's observer (null: none), for an observer that looks on and passes ops to it.
OpObserver* op_observer();

// compute() through the observer; ops nested inside an observed one are not observed
// (their outer op stands for them).
at::Tensor observe_op(const ObservedOp& op, const std::function<at::Tensor()>& compute);
// The same for a collective outside DTensor's layouts, `name`, that reads `input`.
at::Tensor observe_collective(const char* name, const at::Tensor& input, const std::function<at::Tensor()>& compute);

}  // namespace hp
