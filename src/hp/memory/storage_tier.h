// Where tensors go when they leave memory: a storage tier keeps tensors under string keys
// and brings them back into tensors of the same shape. FileTier: one file per key in a
// directory on local disk; HostTier (host_tier.h): host memory, pinned buffers and a copy
// stream for device tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <mutex>
#include <set>
#include <string>

namespace hp::memory {

class StorageTier {
 public:
  virtual ~StorageTier() = default;
  // Stores a copy of `t` (contiguous bytes) under `key`, replacing what was there. Throws
  // hp::Error naming the key and the cause (a full disk) and leaves `t` untouched.
  virtual void write(const std::string& key, const at::Tensor& t) = 0;
  // Fills `into` (contiguous, the size written) from `key`. Throws hp::Error when the key's
  // data is gone or has another size.
  virtual void read(const std::string& key, at::Tensor& into) = 0;
  virtual void remove(const std::string& key) = 0;
  virtual std::string describe() const = 0;
};

// Files `dir/key` rewritten in place with pwrite and read with pread, each call opening
// the file by its path, so a file deleted under a run is an error at its next read instead
// of data read from an unlinked inode. Plain page-cache I/O: at these sizes (optimizer
// state in batches of tens of MiB) O_DIRECT's aligned buffers would cost a copy and save
// nothing measurable, and a memory map would leave every touched page counted in the
// resident set. A removed key's file is kept, renamed, for the next new key: activation
// swap writes new keys every step, and writing a new file takes fresh page-cache pages
// (7 MiB in 15 ms here) where rewriting one takes 1 ms.
class FileTier : public StorageTier {
 public:
  explicit FileTier(std::string dir);  // created if missing
  ~FileTier() override;                // removes the files it wrote, and the directory if then empty
  void write(const std::string& key, const at::Tensor& t) override;
  void read(const std::string& key, at::Tensor& into) override;
  void remove(const std::string& key) override;
  std::string describe() const override { return "files in " + dir_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string path(const std::string& key) const { return dir_ + "/" + key; }
  // A kept file for a new key's path, if there is one (with `n` bytes, where one has).
  void recycle_into(const std::string& p, int64_t n);
  std::string dir_;
  std::mutex mu_;
  std::set<std::string> written_;
  std::multimap<int64_t, std::string> spare_;  // removed keys' files, by size
  uint64_t spares_made_ = 0;
};

}  // namespace hp::memory
