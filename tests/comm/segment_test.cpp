// Shared-memory segments: a peer's segment is mapped only when it is our user's with mode
// 0600, and names whose creator has died are removed by the next run of the same user.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "hp/base/error.h"
#include "hp/comm/symm/segment.h"
#include "scoped_env.h"

using hp::symm::Segment;

namespace {

std::string test_prefix() { return "/hp-" + std::to_string(::getuid()) + "-segtest" + std::to_string(::getpid()); }

std::string pid_namespace() {
  char link[64] = {};
  ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  const std::string s = link;
  return s.substr(s.find('[') + 1, s.find(']') - s.find('[') - 1);
}

bool exists(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

void make(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << name;
  ::close(fd);
}

// A pid that no process has now: a child that has exited and been waited for.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

std::string error_of(const std::string& name, size_t bytes) {
  try {
    Segment::open(name, bytes);
  } catch (const hp::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Segment, APeersSegmentMustBeOursWithMode0600) {
  ScopedEnv prefix("HP_SHM_PREFIX", test_prefix().c_str());
  Segment own = Segment::create(4096, "mode");
  const std::string path = "/dev/shm" + own.name();
  EXPECT_NO_THROW(Segment::open(own.name(), 4096));

  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);  // readable by every user: refused
  std::string m = error_of(own.name(), 4096);
  EXPECT_NE(m.find("refusing to map shared-memory segment " + own.name()), std::string::npos) << m;
  EXPECT_NE(m.find("with mode 0644"), std::string::npos) << m;

  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  if (::geteuid() == 0) {  // another user's segment: refused (only root can make one here)
    ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
    m = error_of(own.name(), 4096);
    EXPECT_NE(m.find("owned by uid 65534"), std::string::npos) << m;
    ASSERT_EQ(::chown(path.c_str(), 0, 0), 0);
  }
  EXPECT_NO_THROW(Segment::open(own.name(), 4096));
}

TEST(Segment, NamesCarryTheCreatorsPid) {
  ScopedEnv prefix("HP_SHM_PREFIX", test_prefix().c_str());
  Segment s = Segment::create(4096, "7");
  const std::string tail = "-7@" + std::to_string(::getpid()) + "." + pid_namespace();
  EXPECT_EQ(s.name().rfind(test_prefix() + "-", 0), 0u) << s.name();
  EXPECT_EQ(s.name().substr(s.name().size() - tail.size()), tail) << s.name();
}

TEST(Segment, OnlySegmentsWhoseCreatorIsDeadAreReaped) {
  const std::string p = test_prefix(), ns = pid_namespace(), dead = std::to_string(dead_pid());
  const std::string orphan = p + "-a-0@" + dead + "." + ns;
  const std::string live = p + "-b-0@" + std::to_string(::getpid()) + "." + ns;
  const std::string elsewhere = p + "-c-0@" + dead + ".1";  // another pid namespace's pid
  const std::string unowned = p + "-d-0";
  for (const auto& n : {orphan, live, elsewhere, unowned}) make(n);
  hp::symm::reap_orphan_segments();
  EXPECT_FALSE(exists(orphan));
  EXPECT_TRUE(exists(live));
  EXPECT_TRUE(exists(elsewhere));
  EXPECT_TRUE(exists(unowned));
  for (const auto& n : {orphan, live, elsewhere, unowned}) ::shm_unlink(n.c_str());
}
