#include "hp/checkpoint/checkpointer.h"

#include <ATen/ATen.h>

#include <cstring>
#include <functional>
#include <iostream>
#include <iterator>

#include "hp/base/error.h"
#include "hp/checkpoint/load.h"
#include "hp/checkpoint/save.h"
#include "hp/comm/world.h"

namespace hp::checkpoint {

Checkpointer::Checkpointer(CheckpointOptions options) : options_(std::move(options)) {
  HP_CHECK(!options_.dir.empty()) << "checkpoint: no directory given";
  HP_CHECK(options_.keep >= 0) << "checkpoint: keep must be >= 0, found " << options_.keep;
}

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "checkpoint: the last asynchronous save failed: " << e.what() << std::endl;
  }
}

namespace {

// Copies every piece into `buffers` (reused when shapes repeat) and points the piece at
// its copy. `versions`, when given, are the pieces' version counters at save(): a piece
// changed since then fails the save, naming the tensor.
void take_snapshot(SaveJob& job, std::vector<at::Tensor>& buffers, const std::vector<int64_t>* versions) {
  buffers.resize(job.pieces.size());
  for (size_t i = 0; i < job.pieces.size(); ++i) {
    auto& p = job.pieces[i];
    at::Tensor& buf = buffers[i];
    if (!buf.defined() || buf.sizes() != p.data.sizes() || buf.scalar_type() != p.data.scalar_type())
      buf = at::empty_like(p.data, at::MemoryFormat::Contiguous);
    std::memcpy(buf.data_ptr(), p.data.data_ptr(), static_cast<size_t>(p.bytes));  // both contiguous
    HP_CHECK(!versions || p.data._version() == (*versions)[i])
        << "checkpoint step " << job.step << ": tensor '" << p.tensor
        << "' changed while its snapshot was taken; call Checkpointer::wait_for_snapshot() before updating "
           "the saved state (the optimizer step)";
    p.data = buf;
  }
}

}  // namespace

void Checkpointer::save(int64_t step, const State& state) {
  wait();
  SaveJob job = plan_save(options_.dir, step, options_.keep, state);
  if (!options_.async) {
    write_and_commit(job);
    return;
  }
  const bool deferred = options_.defer_snapshot;
  std::vector<int64_t> versions;
  if (deferred) {
    for (const auto& p : job.pieces) versions.push_back(p.data._version());
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_taken_ = false;
    live_.clear();
    for (const auto& p : job.pieces) live_.push_back(p.data);
    versions_at_wait_.clear();
  } else {
    // Here: the live tensors change as soon as training goes on.
    take_snapshot(job, buffers_, nullptr);
  }
  writer_ = std::thread([this, deferred, job = std::move(job), versions = std::move(versions)]() mutable {
    auto snapshot_done = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      snapshot_taken_ = true;
      snapshot_cv_.notify_all();
    };
    try {
      // A failed snapshot fails the save on every rank, as a failed write does.
      std::function<void()> prepare;
      if (deferred)
        prepare = [&] {
          try {
            take_snapshot(job, buffers_, &versions);
          } catch (...) {
            snapshot_done();
            throw;
          }
          snapshot_done();
        };
      // The versions as of wait_for_snapshot() (or now, if it was not called) must be
      // those of save(): else a change may have been under way while the copy was taken.
      std::function<void()> verify;
      if (deferred)
        verify = [&] {
          std::lock_guard<std::mutex> lock(mu_);
          for (size_t i = 0; i < live_.size(); ++i) {
            const int64_t seen = versions_at_wait_.empty() ? live_[i]._version() : versions_at_wait_[i];
            HP_CHECK(seen == versions[i])
                << "checkpoint step " << job.step << ": tensor '" << job.pieces[i].tensor
                << "' changed while its snapshot was taken; call Checkpointer::wait_for_snapshot() before "
                   "updating the saved state (the optimizer step)";
          }
        };
      write_and_commit(job, prepare, verify);
    } catch (...) {
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.clear();  // the model's own tensors: not held past the save
    }
    snapshot_done();
  });
}

void Checkpointer::wait_for_snapshot() {
  std::unique_lock<std::mutex> lock(mu_);
  snapshot_cv_.wait(lock, [this] { return snapshot_taken_; });
  if (!live_.empty() && versions_at_wait_.empty())
    for (const at::Tensor& t : live_) versions_at_wait_.push_back(t._version());
}

void Checkpointer::wait() {
  if (writer_.joinable()) writer_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::optional<int64_t> Checkpointer::latest_step() const { return checkpoint::latest_step(options_.dir); }

namespace {

// Every rank says whether it loaded; returns "" when all did, else one failing rank's
// reason, the same on every rank.
std::string failure_anywhere(const std::string& key, const std::string& why) {
  auto world = comm::current_world();
  if (!why.empty()) {
    const std::string text = "rank " + std::to_string(world->rank()) + ": " + why;
    world->store()->set(key + "/why", std::vector<uint8_t>(text.begin(), text.end()));
  }
  world->store()->add(key + "/failed", why.empty() ? 0 : 1);
  store_barrier(*world->store(), key + "/arrived", world->size(), world->timeout(),
                "loading a checkpoint: rank " + std::to_string(world->rank()));
  if (world->store()->add(key + "/failed", 0) == 0) return "";
  const auto got = world->store()->get(key + "/why");
  return {got.begin(), got.end()};
}

}  // namespace

std::optional<int64_t> Checkpointer::load_latest(State& state) const {
  const auto steps = list_steps(options_.dir);
  if (steps.empty()) return std::nullopt;
  auto world = comm::current_world();
  // Every rank loads in the same order, so its own counter names the same load everywhere.
  const std::string key = "hp/ckpt/load/" + std::to_string(world->store()->add(
                                                 "hp/ckpt/load_seq/" + std::to_string(world->rank()), 1));
  std::string failures;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string dir = published_dir(options_.dir, *it);
    std::string why;
    try {
      load(dir, state);
    } catch (const std::exception& e) {
      why = e.what();
      if (why.empty()) why = "unknown error";
    }
    const std::string failure = failure_anywhere(key + "/" + std::to_string(*it), why);
    if (failure.empty()) return *it;
    failures += "\n  " + dir + ": " + failure;
    if (world->rank() == 0)
      std::cerr << "checkpoint: " << dir << " failed verification (" << failure << "); "
                << (std::next(it) != steps.rend() ? "falling back to step " + std::to_string(*std::next(it))
                                                  : std::string("no older checkpoint"))
                << std::endl;
  }
  HP_FAIL() << "checkpoint: none of the " << steps.size() << " checkpoints under " << options_.dir
            << " is intact:" << failures;
  return std::nullopt;
}

}  // namespace hp::checkpoint
