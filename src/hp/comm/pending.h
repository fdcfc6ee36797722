// A collective in flight: a c10d Work (Gloo, NCCL) or a Job on the progress engine
// (shared memory, hierarchical). wait() blocks (bounded by the group's timeout), finishes
// any local work (unpacking, local sums) and returns the result.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "hp/comm/backend.h"

namespace hp::comm {

class Job;

class Pending {
 public:
  Pending() = default;
  Pending(WorkPtr work, std::function<at::Tensor()> finish, std::string what,
          std::chrono::milliseconds timeout);
  Pending(std::shared_ptr<Job> job, std::function<at::Tensor()> finish, std::string what,
          std::chrono::milliseconds timeout);
  static Pending done(at::Tensor result);

  // The same collective, followed by local work on its result once it lands.
  Pending then(std::function<at::Tensor(at::Tensor)> next, std::string what) &&;

  at::Tensor wait();
  bool ready() const;

 private:
  WorkPtr work_;
  std::shared_ptr<Job> job_;
  std::function<at::Tensor()> finish_;
  std::string what_;
  std::chrono::milliseconds timeout_{0};
  at::Tensor result_;
  bool finished_ = false;
};

}  // namespace hp::comm
