#include "hp/comm/pending.h"

#include "hp/base/error.h"

namespace hp::comm {

Pending::Pending(WorkPtr work, std::function<at::Tensor()> finish, std::string what,
                 std::chrono::milliseconds timeout)
    : work_(std::move(work)), finish_(std::move(finish)), what_(std::move(what)), timeout_(timeout) {}

Pending Pending::done(at::Tensor result) {
  Pending p;
  p.result_ = std::move(result);
  p.finished_ = true;
  return p;
}

Pending Pending::then(std::function<at::Tensor(at::Tensor)> next, std::string what) && {
  if (finished_) return done(next(result_));
  auto first = std::move(finish_);
  return Pending(std::move(work_), [first, next] { return next(first ? first() : at::Tensor()); },
                 std::move(what), timeout_);
}

at::Tensor Pending::wait() {
  if (finished_) return result_;
  if (work_) {
    try {
      work_->wait(timeout_);
    } catch (const std::exception& e) {
      HP_FAIL() << what_ << " did not complete (timeout " << timeout_.count() << " ms): " << e.what();
    }
  }
  if (finish_) result_ = finish_();
  finish_ = nullptr;
  work_.reset();
  finished_ = true;
  return result_;
}

bool Pending::ready() const { return finished_ || !work_ || work_->isCompleted(); }

}  // namespace hp::comm
