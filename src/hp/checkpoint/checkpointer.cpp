#include "hp/checkpoint/checkpointer.h"

#include <ATen/ATen.h>

#include <cstring>
#include <iostream>

#include "hp/base/error.h"
#include "hp/checkpoint/load.h"
#include "hp/checkpoint/save.h"

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

void Checkpointer::save(int64_t step, const State& state) {
  wait();
  SaveJob job = plan_save(options_.dir, step, options_.keep, state);
  if (!options_.async) {
    write_and_commit(job);
    return;
  }
  // Snapshot: the live tensors change as soon as training goes on.
  buffers_.resize(job.pieces.size());
  for (size_t i = 0; i < job.pieces.size(); ++i) {
    auto& p = job.pieces[i];
    at::Tensor& buf = buffers_[i];
    if (!buf.defined() || buf.sizes() != p.data.sizes() || buf.scalar_type() != p.data.scalar_type())
      buf = at::empty_like(p.data, at::MemoryFormat::Contiguous);
    std::memcpy(buf.data_ptr(), p.data.data_ptr(), static_cast<size_t>(p.bytes));  // both contiguous
    p.data = buf;
  }
  writer_ = std::thread([this, job = std::move(job)] {
    try {
      write_and_commit(job);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void Checkpointer::wait() {
  if (writer_.joinable()) writer_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::optional<int64_t> Checkpointer::latest_step() const { return checkpoint::latest_step(options_.dir); }

std::optional<int64_t> Checkpointer::load_latest(State& state) const {
  auto step = latest_step();
  if (step) load(step_dir(options_.dir, *step), state);
  return step;
}

}  // namespace hp::checkpoint
