#include "hp/memory/host_tier.h"

#include <ATen/ATen.h>

#include "hp/base/error.h"

#ifdef HP_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace hp::memory {

struct HostTier::Entry {
  at::Tensor host;  // contiguous bytes, pinned when it holds a device tensor's (and pin_memory is on)
#ifdef HP_CUDA
  std::unique_ptr<at::cuda::CUDAEvent> copied;  // recorded on the copy stream after the last copy
  void wait() {
    if (copied) copied->synchronize();
  }
#else
  void wait() {}
#endif
};

namespace {

// One byte view of a contiguous tensor's elements.
at::Tensor as_bytes(const at::Tensor& t) { return t.view({-1}).view(at::kByte); }

at::Tensor host_buffer(int64_t nbytes, bool pinned) {
  return at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
}

#ifdef HP_CUDA
// One copy stream per device, made on first use.
c10::cuda::CUDAStream copy_stream(c10::DeviceIndex device) {
  static std::mutex mu;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it == streams.end()) it = streams.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  return it->second;
}

// Runs `copy` on the device's copy stream after the work queued so far on the current
// stream; `device_tensor` stays allocated until the copy ends; returns the event after it.
template <typename Copy>
std::unique_ptr<at::cuda::CUDAEvent> on_copy_stream(const at::Tensor& device_tensor, Copy copy) {
  const c10::DeviceIndex device = device_tensor.device().index();
  c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device), stream = copy_stream(device);
  at::cuda::CUDAEvent ready;
  ready.record(compute);
  ready.block(stream);
  {
    c10::cuda::CUDAStreamGuard on(stream);
    copy();
  }
  c10::cuda::CUDACachingAllocator::recordStream(device_tensor.storage().data_ptr(), stream);
  auto done = std::make_unique<at::cuda::CUDAEvent>();
  done->record(stream);
  return done;
}
#endif

}  // namespace

HostTier::HostTier(bool pin_memory) : pin_memory_(pin_memory) {}

HostTier::~HostTier() {
  for (auto& [key, e] : entries_) e->wait();
}

void HostTier::write(const std::string& key, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const int64_t n = static_cast<int64_t>(c.nbytes());
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Entry>& e = entries_[key];
  if (!e) e = std::make_unique<Entry>();
  e->wait();  // the buffer's previous copy must end before it is overwritten
  const bool pinned = c.is_cuda() && pin_memory_;
  if (!e->host.defined() || e->host.numel() != n || e->host.is_pinned() != pinned) e->host = host_buffer(n, pinned);
  if (n == 0) return;
#ifdef HP_CUDA
  if (c.is_cuda()) {
    e->copied = on_copy_stream(c, [&] { e->host.copy_(as_bytes(c), /*non_blocking=*/true); });
    return;
  }
#endif
  HP_CHECK(c.device().is_cpu()) << "HostTier: " << key << " is on " << c.device()
                                << ", which this build cannot copy from (CUDA is not built)";
  e->host.copy_(as_bytes(c));
}

void HostTier::read(const std::string& key, at::Tensor& into) {
  HP_CHECK(into.is_contiguous()) << "HostTier: reading " << key << " into a non-contiguous tensor";
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  HP_CHECK(it != entries_.end()) << "HostTier: nothing was written under " << key;
  Entry& e = *it->second;
  const int64_t n = static_cast<int64_t>(into.nbytes());
  HP_CHECK(e.host.numel() == n) << "HostTier: " << key << " holds " << e.host.numel() << " bytes, expected " << n;
  if (n == 0) return;
#ifdef HP_CUDA
  if (into.is_cuda()) {
    at::Tensor bytes = as_bytes(into);
    e.copied = on_copy_stream(into, [&] { bytes.copy_(e.host, /*non_blocking=*/true); });
    e.copied->block(c10::cuda::getCurrentCUDAStream(into.device().index()));
    return;
  }
#endif
  e.wait();
  as_bytes(into).copy_(e.host);
}

void HostTier::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  it->second->wait();
  entries_.erase(it);
}

std::string HostTier::describe() const { return "host memory"; }

int64_t HostTier::resident_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& [key, e] : entries_) total += e->host.defined() ? e->host.numel() : 0;
  return total;
}

}  // namespace hp::memory
