#include "hp/comm/pending.h"

#include "hp/base/error.h"
#include "hp/comm/engine.h"
#include "hp/comm/trace.h"

namespace hp::comm {

Pending::Pending(WorkPtr work, std::function<at::Tensor()> finish, std::string what,
                 std::chrono::milliseconds timeout)
    : work_(std::move(work)), finish_(std::move(finish)), what_(std::move(what)), timeout_(timeout) {}

Pending::Pending(std::shared_ptr<Job> job, std::function<at::Tensor()> finish, std::string what,
                 std::chrono::milliseconds timeout)
    : job_(std::move(job)), finish_(std::move(finish)), what_(std::move(what)), timeout_(timeout) {}

Pending Pending::done(at::Tensor result) {
  Pending p;
  p.result_ = std::move(result);
  p.finished_ = true;
  return p;
}

Pending Pending::then(std::function<at::Tensor(at::Tensor)> next, std::string what) && {
  if (finished_) return done(next(result_));
  auto first = std::move(finish_);
  Pending p(std::move(work_), [first, next] { return next(first ? first() : at::Tensor()); }, std::move(what),
            timeout_);
  p.job_ = std::move(job_);
  return p;
}

at::Tensor Pending::wait() {
  if (finished_) return result_;
  // Blocking here is communication the caller did not hide.
  trace::Span span("wait", trace::enabled() && !ready() ? "wait " + what_ : std::string());
  if (job_) {
    try {
      job_->wait(timeout_);
    } catch (const std::exception& e) {
      finish_ = nullptr;
      job_.reset();
      finished_ = true;
      HP_FAIL() << what_ << " failed: " << e.what();
    }
  }
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
  job_.reset();
  finished_ = true;
  return result_;
}

bool Pending::ready() const {
  if (finished_) return true;
  if (job_ && !job_->done()) return false;
  return !work_ || work_->isCompleted();
}

}  // namespace hp::comm
