#include "hp/memory/swap_optimizer.h"

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <future>

#include "hp/base/error.h"

namespace hp::memory {

SwapOptimizer::SwapOptimizer(std::vector<DTensor*> params, OptimizerFactory make, std::shared_ptr<StorageTier> tier,
                             SwapOptimizerOptions options)
    : params_(std::move(params)), tier_(std::move(tier)), options_(options) {
  HP_CHECK(!params_.empty()) << "SwapOptimizer: no parameters";
  HP_CHECK(options_.batch_bytes > 0) << "SwapOptimizer: batch_bytes = " << options_.batch_bytes << " must be > 0";
  HP_CHECK(tier_) << "SwapOptimizer: no storage tier";
  // Sizes that are the same on every rank (the largest shard of each parameter), so that
  // every rank cuts the same batches: an optimizer that exchanges data in its step, as
  // distributed Muon does, then issues the same collectives everywhere, however uneven the
  // shards.
  auto bytes = [](const DTensor* p) { return p->spec().max_local_bytes(); };
  int64_t total = 0;
  for (DTensor* p : params_) total += bytes(p);
  const int64_t count = std::max<int64_t>(1, (total + options_.batch_bytes - 1) / options_.batch_bytes);
  const double target = static_cast<double>(total) / static_cast<double>(count);
  // Contiguous batches closing at the multiples of total / count: byte-balanced to within
  // one parameter.
  std::vector<std::vector<DTensor*>> groups(1);
  int64_t seen = 0;
  for (DTensor* p : params_) {
    const int64_t n = bytes(p);
    if (!groups.back().empty() && static_cast<int64_t>(groups.size()) < count &&
        static_cast<double>(seen) + 0.5 * static_cast<double>(n) > target * static_cast<double>(groups.size()))
      groups.emplace_back();
    groups.back().push_back(p);
    seen += n;
  }
  for (auto& g : groups) {
    Batch b;
    b.params = g;
    b.inner = make(g);
    HP_CHECK(b.inner) << "SwapOptimizer: the factory made no optimizer";
    b.entries = b.inner->state();
    for (const optim::StateEntry& e : b.entries) {
      b.sizes.push_back(e.local->sizes().vec());
      b.options.push_back(e.local->options());
    }
    batches_.push_back(std::move(b));
  }
  for (size_t i = 0; i < batches_.size(); ++i) evict(i);
}

std::string SwapOptimizer::key(size_t batch, size_t entry) const {
  return "batch" + std::to_string(batch) + "." + batches_[batch].entries[entry].name + "." + std::to_string(entry);
}

std::vector<at::Tensor> SwapOptimizer::load(size_t b) const {
  std::vector<at::Tensor> out;
  const Batch& batch = batches_[b];
  for (size_t j = 0; j < batch.entries.size(); ++j) {
    at::Tensor t = at::empty(batch.sizes[j], batch.options[j]);
    tier_->read(key(b, j), t);
    out.push_back(t);
  }
  return out;
}

std::vector<at::Tensor> SwapOptimizer::bring_in(size_t b) const {
  if (options_.parameters) options_.parameters->bring_in(batches_[b].params);
  return batches_[b].resident ? std::vector<at::Tensor>() : load(b);
}

void SwapOptimizer::send_out(size_t b) {
  if (options_.parameters) options_.parameters->send_out(batches_[b].params);
  write(b);
}

void SwapOptimizer::install(size_t b, std::vector<at::Tensor> state) {
  Batch& batch = batches_[b];
  for (size_t j = 0; j < batch.entries.size(); ++j) *batch.entries[j].local = std::move(state[j]);
  batch.resident = true;
}

void SwapOptimizer::write(size_t b) const {
  const Batch& batch = batches_[b];
  for (size_t j = 0; j < batch.entries.size(); ++j) tier_->write(key(b, j), *batch.entries[j].local);
}

// Only once every write of the batch went through is its memory given up.
void SwapOptimizer::release(size_t b) {
  for (const optim::StateEntry& e : batches_[b].entries) *e.local = at::Tensor();
  batches_[b].resident = false;
}

void SwapOptimizer::evict(size_t b) {
  if (!batches_[b].resident) return;
  write(b);
  release(b);
}

void SwapOptimizer::step() {
  std::future<std::vector<at::Tensor>> next;
  std::future<void> writing;  // of batch `written`
  size_t written = 0;
  std::exception_ptr failure;  // the first failed write: thrown once every batch is updated
  auto finish = [&](size_t b, const std::function<void()>& write_out) {
    try {
      write_out();
      release(b);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  auto finish_writing = [&] {
    if (writing.valid()) finish(written, [&] { writing.get(); });
  };
  for (size_t b = 0; b < batches_.size(); ++b) {
    std::vector<at::Tensor> state = next.valid() ? next.get() : bring_in(b);
    if (!batches_[b].resident) install(b, std::move(state));
    if (options_.prefetch && b + 1 < batches_.size())
      next = std::async(std::launch::async, [this, b] { return bring_in(b + 1); });
    batches_[b].inner->step();
    finish_writing();  // the batch before: at most three batches in memory
    if (options_.write_behind) {
      writing = std::async(std::launch::async, [this, b] { send_out(b); });
      written = b;
    } else {
      finish(b, [&] { send_out(b); });
    }
  }
  finish_writing();
  if (failure) std::rethrow_exception(failure);
}

void SwapOptimizer::set_lr(double lr) {
  for (Batch& b : batches_) b.inner->set_lr(lr);
}

void SwapOptimizer::set_steps(int64_t steps) {
  for (Batch& b : batches_) b.inner->set_steps(steps);
}

std::vector<optim::StateEntry> SwapOptimizer::state() {
  std::vector<optim::StateEntry> out;
  for (size_t b = 0; b < batches_.size(); ++b) {
    if (!batches_[b].resident) install(b, load(b));
    out.insert(out.end(), batches_[b].entries.begin(), batches_[b].entries.end());
  }
  return out;
}

int64_t SwapOptimizer::resident_bytes() const {
  int64_t n = 0;
  for (const Batch& b : batches_)
    for (const optim::StateEntry& e : b.entries)
      if (e.local->defined()) n += static_cast<int64_t>(e.local->nbytes());
  return n;
}

}  // namespace hp::memory
