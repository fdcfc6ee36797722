#include "hp/memory/storage_tier.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "hp/base/error.h"

namespace hp::memory {
namespace {

// Closes a file descriptor when it goes.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

FileTier::FileTier(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  HP_CHECK(!ec) << "FileTier: cannot create " << dir_ << ": " << ec.message();
}

FileTier::~FileTier() {
  for (const std::string& key : written_) ::unlink(path(key).c_str());
  for (const auto& [n, p] : spare_) ::unlink(p.c_str());
  ::rmdir(dir_.c_str());
}

void FileTier::recycle_into(const std::string& p, int64_t n) {
  std::string from;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spare_.empty()) return;
    auto it = spare_.find(n);
    if (it == spare_.end()) it = spare_.begin();
    from = it->second;
    spare_.erase(it);
  }
  struct stat st;
  if (::stat(p.c_str(), &st) == 0 || ::rename(from.c_str(), p.c_str()) != 0) ::unlink(from.c_str());
}

void FileTier::write(const std::string& key, const at::Tensor& t) {
  HP_CHECK(t.is_cpu()) << "FileTier: " << key << " is a " << t.device()
                       << " tensor; files hold host tensors (a device tensor's tier is HostTier)";
  const at::Tensor c = t.contiguous();
  const std::string p = path(key);
  bool fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh = written_.insert(key).second;
  }
  if (fresh) recycle_into(p, static_cast<int64_t>(c.nbytes()));
  // Overwritten in place, not truncated first: a truncated file gives its blocks back
  // (a discard on a mount with `discard`) and ext4 flushes a file rewritten after a
  // truncation when it is closed, so every step would wait for the disk.
  Fd f{::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600)};
  HP_CHECK(f.fd >= 0) << "FileTier: cannot open " << p << " for writing: " << std::strerror(errno);
  const char* data = static_cast<const char*>(c.data_ptr());
  const int64_t n = static_cast<int64_t>(c.nbytes());
  int64_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(f.fd, data + done, static_cast<size_t>(n - done), done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = w < 0 ? std::strerror(errno) : "no progress";
      [[maybe_unused]] const int emptied = ::ftruncate(f.fd, 0);  // no half-new bytes read back as the tensor
      HP_FAIL() << "FileTier: writing " << n << " bytes to " << p << " stopped after " << done << ": " << why
                << " (the tensor stays in memory)";
    }
    done += w;
  }
  struct stat st;
  HP_CHECK(::fstat(f.fd, &st) == 0) << "FileTier: stat " << p << ": " << std::strerror(errno);
  HP_CHECK(st.st_size == n || ::ftruncate(f.fd, n) == 0)
      << "FileTier: cannot cut " << p << " to " << n << " bytes: " << std::strerror(errno);
}

void FileTier::read(const std::string& key, at::Tensor& into) {
  HP_CHECK(into.is_contiguous()) << "FileTier: reading " << key << " into a non-contiguous tensor";
  HP_CHECK(into.is_cpu()) << "FileTier: reading " << key << " into a " << into.device()
                          << " tensor; files hold host tensors (a device tensor's tier is HostTier)";
  const std::string p = path(key);
  Fd f{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
  HP_CHECK(f.fd >= 0) << "FileTier: the offload file " << p << " cannot be opened: " << std::strerror(errno)
                      << " (removed or moved while in use?)";
  struct stat st;
  HP_CHECK(::fstat(f.fd, &st) == 0) << "FileTier: stat " << p << ": " << std::strerror(errno);
  const int64_t n = static_cast<int64_t>(into.nbytes());
  HP_CHECK(st.st_size == n) << "FileTier: the offload file " << p << " holds " << st.st_size << " bytes, expected " << n;
  char* data = static_cast<char*>(into.data_ptr());
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(f.fd, data + done, static_cast<size_t>(n - done), done);
    if (r < 0 && errno == EINTR) continue;
    HP_CHECK(r > 0) << "FileTier: reading " << p << " stopped after " << done << " of " << n
                    << " bytes: " << (r < 0 ? std::strerror(errno) : "end of file");
    done += r;
  }
}

void FileTier::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (written_.erase(key) == 0) return;
  // Kept under a name no key has (keys name files: no '/' and no leading '.' needed).
  const std::string p = path(key), kept = dir_ + "/.spare." + std::to_string(spares_made_++);
  struct stat st;
  if (::stat(p.c_str(), &st) == 0 && ::rename(p.c_str(), kept.c_str()) == 0)
    spare_.emplace(static_cast<int64_t>(st.st_size), kept);
  else
    ::unlink(p.c_str());
}

}  // namespace hp::memory
