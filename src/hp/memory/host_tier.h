// A storage tier in host memory, for tensors that live on an accelerator: activations and
// parameters swapped out of device memory wait in page-locked (pinned) host buffers, and
// copies run on a copy stream of their own so they overlap the compute stream.
//
// Device (CUDA) tensors: write() orders the copy after the work that produced the tensor
// (an event on the current stream, waited for on the copy stream) and returns at once; the
// caller may drop its tensor (the allocator keeps the memory until the copy ends) but must
// not write to it. read() copies back on the copy stream and makes the current stream wait
// for it, so work queued after read() sees the data; the host buffer is reused by the next
// write of the same key. Host tensors are copied synchronously into the same kind of
// buffers (ordinary memory), which is what runs on a machine without a GPU.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "hp/memory/storage_tier.h"

namespace hp::memory {

class HostTier : public StorageTier {
 public:
  // pin_memory off: pageable host buffers (copies of device tensors then block the caller).
  explicit HostTier(bool pin_memory = true);
  ~HostTier() override;  // waits for copies still in flight
  void write(const std::string& key, const at::Tensor& t) override;
  void read(const std::string& key, at::Tensor& into) override;
  void remove(const std::string& key) override;
  std::string describe() const override;
  int64_t resident_bytes() const;  // host bytes held now

  struct Entry;  // a host buffer and, for device copies, the event that ends its copy

 private:
  bool pin_memory_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_;
};

}  // namespace hp::memory
