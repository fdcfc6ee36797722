#include "hp/comm/engine.h"

#include "hp/base/error.h"

namespace hp::comm {
namespace {

thread_local bool t_progress_thread = false;

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

void Job::run() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    started_at_ = std::chrono::steady_clock::now();
  }
  std::exception_ptr error;
  try {
    body_();
  } catch (...) {
    error = std::current_exception();
  }
  body_ = nullptr;  // drops the tensors it held
  std::lock_guard<std::mutex> lock(mu_);
  error_ = error;
  done_ = true;
  cv_.notify_all();
}

void Job::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mu_);
  body_ = nullptr;
  error_ = std::move(e);
  done_ = true;
  cv_.notify_all();
}

bool Job::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Job::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto limit = 2 * timeout;
  while (!done_) {
    if (!started_ || timeout.count() <= 0) {
      cv_.wait(lock);  // queued: the jobs ahead of it are bounded by their own timeouts
      continue;
    }
    const auto deadline = started_at_ + limit;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !done_)
      HP_FAIL() << what_ << " did not complete within " << limit.count()
                << " ms on the progress thread (its peers never joined it)";
  }
  if (error_) std::rethrow_exception(error_);
}

std::shared_ptr<Job> Engine::submit(std::function<void()> body, std::string what) {
  auto job = std::make_shared<Job>(std::move(body), std::move(what));
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_ || t_progress_thread) {
    lock.unlock();
    job->run();
    return job;
  }
  if (!first_failure_.empty()) {
    lock.unlock();
    job->fail(std::make_exception_ptr(Error(job->what() + " not run: an earlier asynchronous collective on this rank failed: " + first_failure_)));
    return job;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  queue_.push_back(job);
  ++unfinished_;
  work_cv_.notify_one();
  return job;
}

bool Engine::busy() const { return unfinished_.load() > 0; }

void Engine::drain() {
  // The synchronous collectives' path when nothing is in flight: no lock.
  if (unfinished_.load() == 0 && !failed_.load()) return;
  if (t_progress_thread) return;
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return unfinished_ == 0; });
  HP_CHECK(first_failure_.empty()) << "an earlier asynchronous collective on this rank failed, so this rank's "
                                   << "collectives are out of step with its peers: " << first_failure_;
}

void Engine::shutdown() {
  std::deque<std::shared_ptr<Job>> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    cancelled.swap(queue_);
    unfinished_ -= static_cast<int>(cancelled.size());
    work_cv_.notify_all();
  }
  for (auto& job : cancelled)
    job->fail(std::make_exception_ptr(Error(job->what() + " cancelled: " + name_ + " shut down with it in flight")));
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  idle_cv_.notify_all();
}

bool Engine::on_progress_thread() { return t_progress_thread; }

void Engine::loop() {
  t_progress_thread = true;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    if (first_failure_.empty()) job->run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A failure leaves this rank's shared-memory state out of step: the rest fail fast.
      if (first_failure_.empty() && job->error_) {
        first_failure_ = job->what() + ": " + message_of(job->error_);
        failed_ = true;
      }
      else if (!job->done())
        job->fail(std::make_exception_ptr(
            Error(job->what() + " not run: an earlier asynchronous collective on this rank failed: " + first_failure_)));
      --unfinished_;
      if (unfinished_ == 0) idle_cv_.notify_all();
    }
  }
}

}  // namespace hp::comm
