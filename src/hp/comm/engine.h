// The progress engine: one thread per rank (per World) that runs the asynchronous
// shared-memory and hierarchical collectives, so that `*_async` returns at once and the
// caller computes while they move data.
//
// Order. Jobs run one at a time in the order they were submitted, and a synchronous
// collective on this rank first waits for every job already submitted (drain), so each
// rank executes its collectives in program order, as when all were synchronous. One
// thread per rank rather than per group: the hierarchical collectives of a group drive
// its host sub-groups, which other groups share (a mesh's in-host and cross-host dims),
// and two threads driving one sub-group would pair calls differently on different ranks.
// The reduction order inside each collective is unchanged, so results are bitwise those
// of the synchronous calls.
//
// Errors. A job's exception is kept and rethrown by the Pending that waits on it; after
// a failure the rank's shared-memory state is out of step with its peers, so the jobs
// behind it, and synchronous calls (drain), fail at once naming the first failure.
// Shutdown cancels the jobs not yet started and waits for the running one, which its
// group's timeout bounds.
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace hp::comm {

// One submitted collective: its body, and once run, its outcome.
class Job {
 public:
  Job(std::function<void()> body, std::string what) : body_(std::move(body)), what_(std::move(what)) {}

  // Blocks until the job has run; rethrows its failure. Once started, it may run for
  // twice `timeout` (its own barriers fail after one, naming the late ranks) before this
  // gives up, naming the job.
  void wait(std::chrono::milliseconds timeout);
  bool done() const;
  const std::string& what() const { return what_; }

 private:
  friend class Engine;
  void run();
  void fail(std::exception_ptr e);

  std::function<void()> body_;
  std::string what_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, done_ = false;
  std::chrono::steady_clock::time_point started_at_;
  std::exception_ptr error_;
};

class Engine {
 public:
  explicit Engine(std::string name) : name_(std::move(name)) {}
  ~Engine() { shutdown(); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues `body` behind every job submitted before it; the thread starts on first use.
  // After shutdown, or on the progress thread itself, the body runs at once, here.
  std::shared_ptr<Job> submit(std::function<void()> body, std::string what);
  // Whether submitted jobs have not all finished.
  bool busy() const;
  // Waits until every submitted job has finished; throws if one failed. A no-op on the
  // progress thread.
  void drain();
  // Fails the jobs not yet started, waits for the running one, stops the thread.
  void shutdown();

  // Whether the calling thread is some engine's progress thread: collectives issued there
  // (the host phases of a hierarchical collective) run inline.
  static bool on_progress_thread();

 private:
  void loop();

  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::atomic<int> unfinished_{0};  // queued or running: read without the lock by drain's fast path
  std::atomic<bool> failed_{false};
  bool stopping_ = false;
  std::string first_failure_;  // empty: none
  std::thread thread_;
};

}  // namespace hp::comm
