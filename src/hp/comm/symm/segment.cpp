#include "hp/comm/symm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "hp/base/error.h"

namespace hp::symm {
namespace {

void* map(int fd, size_t bytes, const std::string& name) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  HP_CHECK(p != MAP_FAILED) << "mmap of shared-memory segment " << name << " (" << bytes
                            << " bytes) failed: " << std::strerror(errno);
  return p;
}

// This process's pid namespace ("4026531836"), "" if unknown: a pid means something only there.
std::string pid_namespace() {
  char link[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  const std::string s(link, n > 0 ? static_cast<size_t>(n) : 0);  // "pid:[4026531836]"
  const size_t open = s.find('['), close = s.find(']');
  return open == std::string::npos || close == std::string::npos ? "" : s.substr(open + 1, close - open - 1);
}

std::string octal(unsigned mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", mode & 07777);
  return text;
}

// The creator's pid from a name ending in "@<pid>.<namespace>" made in namespace `ns`, else 0.
pid_t owner_in(const std::string& name, const std::string& ns) {
  const size_t at = name.rfind('@');
  if (at == std::string::npos || ns.empty()) return 0;
  const std::string owner = name.substr(at + 1);
  const size_t dot = owner.find('.');
  if (dot == std::string::npos || owner.substr(dot + 1) != ns) return 0;
  char* end = nullptr;
  const long pid = std::strtol(owner.c_str(), &end, 10);
  return end == owner.c_str() + dot && pid > 0 ? static_cast<pid_t>(pid) : 0;
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
  reap_orphan_segments();
  // The creator's pid: once it is dead the name is garbage (see reap_orphan_segments).
  s.name_ = segment_prefix() + "-" + hex + "-" + tag + "@" + std::to_string(::getpid()) + "." + pid_namespace();
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
  const bool statted = ::fstat(fd, &st) == 0;
  const int err = errno;
  // Only what our own user made, readable by nobody else: never another user's memory,
  // nor one a third party could also read or have planted.
  const bool trusted = statted && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 07777) == 0600;
  if (!trusted || static_cast<size_t>(st.st_size) != bytes) ::close(fd);
  HP_CHECK(statted) << "cannot fstat shared-memory segment " << name << ": " << std::strerror(err);
  HP_CHECK(trusted) << "refusing to map shared-memory segment " << name << ": it is owned by uid " << st.st_uid
                    << " with mode " << octal(st.st_mode) << ", but a peer's segment must be this user's (uid "
                    << ::geteuid() << ") with mode 0600";
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

namespace hp::symm {

void reap_orphan_segments() {
  const std::string ns = pid_namespace();
  DIR* d = ::opendir("/dev/shm");
  if (!d || ns.empty()) {
    if (d) ::closedir(d);
    return;
  }
  std::vector<std::string> dead;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const pid_t pid = owner_in(name, ns);
    struct stat st {};
    if (pid == 0 || ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != ::geteuid())
      continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) dead.push_back(name);
  }
  ::closedir(d);
  for (const auto& name : dead) ::shm_unlink(("/" + name).c_str());
}

}  // namespace hp::symm
