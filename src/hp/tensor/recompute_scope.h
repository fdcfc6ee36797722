// Whether this thread is recomputing a checkpointed region (a full recompute or a selective
// replay, hp/memory): what a forward records once per step, such as a router's expert
// loads, is not recorded again by the recompute.
#pragma once

namespace hp {

bool recomputing();

// recomputing() is true while one lives on this thread.
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool outer_;
};

}  // namespace hp
