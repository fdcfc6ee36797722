#include "hp/comm/symm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "hp/base/error.h"

namespace hp::symm {
namespace {

void* map(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  HP_CHECK(p != MAP_FAILED) << "mmap of shared-memory segment " << name << " (" << bytes
                            << " bytes) failed: " << std::strerror(errno);
  return p;
}

}  // namespace

std::string segment_prefix() {
  const char* p = std::getenv("HP_SHM_PREFIX");
  if (p && *p) {
    HP_CHECK(p[0] == '/' && std::strchr(p + 1, '/') == nullptr)
        << "HP_SHM_PREFIX must look like /name (one leading slash, no other), got '" << p << "'";
    return p;
  }
  return "/hp-" + std::to_string(::getuid());
}

Segment Segment::create(size_t bytes, const std::string& tag) {
  std::random_device rd;  // /dev/urandom: names other jobs cannot guess
  const uint64_t nonce = (uint64_t(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(nonce));
  Segment s;
  s.name_ = segment_prefix() + "-" + hex + "-" + tag;
  int fd = ::shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  HP_CHECK(fd >= 0) << "cannot create shared-memory segment " << s.name_ << ": " << std::strerror(errno);
  s.named_ = true;
  s.bytes_ = bytes;
  // The umask may only narrow the mode; make 0600 explicit anyway.
  bool ok = ::fchmod(fd, 0600) == 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0;
  const int err = errno;
  if (ok) s.base_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  HP_CHECK(ok && s.base_ != MAP_FAILED)
      << "cannot size or map shared-memory segment " << s.name_ << " to " << bytes
      << " bytes (is /dev/shm full?): " << std::strerror(ok ? errno : err);
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  HP_CHECK(fd >= 0) << "cannot open a peer's shared-memory segment " << name << ": " << std::strerror(errno)
                    << " (is the peer on another host?)";
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<size_t>(st.st_size) != bytes) ::close(fd);
  HP_CHECK(static_cast<size_t>(st.st_size) == bytes)
      << "shared-memory segment " << name << " holds " << st.st_size << " bytes, expected " << bytes;
  Segment s;
  s.name_ = name;
  s.bytes_ = bytes;
  try {
    s.base_ = map(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return s;
}

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  std::swap(base_, o.base_);
  std::swap(bytes_, o.bytes_);
  std::swap(name_, o.name_);
  std::swap(named_, o.named_);
  return *this;
}

Segment::~Segment() {
  unlink();
  if (base_ && base_ != MAP_FAILED) ::munmap(base_, bytes_);
}

void Segment::unlink() {
  if (named_) ::shm_unlink(name_.c_str());
  named_ = false;
}

}  // namespace hp::symm
