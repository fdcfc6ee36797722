#include "hp/comm/symm/cross_memory.h"

#include <sys/uio.h>

#include <cerrno>

namespace hp::symm {

bool read_peer(int64_t pid, uint64_t remote, void* local, size_t bytes) {
  char* to = static_cast<char*>(local);
  size_t done = 0;
  while (done < bytes) {
    iovec l{to + done, bytes - done};
    iovec r{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace hp::symm
