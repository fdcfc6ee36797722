#include "hp/comm/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstring>

#include "hp/base/error.h"

namespace hp::comm {
namespace {

// A listening IPv4 socket on `address` ("" for every interface); `port` 0 picks one.
int listen_on(const std::string& address, int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  HP_CHECK(fd >= 0) << "socket() failed: " << std::strerror(errno);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool parsed = address.empty() ? (addr.sin_addr.s_addr = htonl(INADDR_ANY), true)
                                      : ::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) == 1;
  socklen_t len = sizeof addr;
  const bool ok = parsed && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::listen(fd, 4096) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  if (!ok) ::close(fd);
  HP_CHECK(parsed) << "the store's listen address '" << address << "' is not an IPv4 address";
  HP_CHECK(ok) << "the rendezvous store cannot listen on " << (address.empty() ? "*" : address) << ":" << port
               << ": " << std::strerror(err) << (err == EADDRINUSE ? " (another job on this port?)" : "");
  port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

StorePtr host_store(const std::string& address, int port, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.masterListenFd = listen_on(address, port);  // the store owns the socket from here
  o.port = static_cast<uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(address.empty() ? "0.0.0.0" : address, o);
}

StorePtr join_store(const std::string& host, int port, std::chrono::milliseconds timeout, const std::string& who) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    HP_FAIL() << who << ": cannot reach the rendezvous store at " << host << ":" << port << " within "
              << timeout.count() / 1000.0 << " s: " << e.what();
  }
  return {};
}

std::string attempt_prefix(int restart_count) { return "/worker/attempt_" + std::to_string(restart_count); }

StorePtr rendezvous_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  const std::string who = "rank " + std::to_string(env.rank);
  if (env.launcher_store) {
    auto store = join_store(env.master_addr, env.master_port, timeout, who + " (the launcher hosts the store; is it alive?)");
    return c10::make_intrusive<c10d::PrefixStore>(attempt_prefix(env.restart_count), store);
  }
  // One host: nobody else needs to reach the store, so it stays on loopback.
  const bool one_host = env.local_world_size == env.world_size;
  const std::string host = one_host ? "127.0.0.1" : env.master_addr;
  if (env.rank == 0) {
    try {
      return host_store(one_host ? "127.0.0.1" : "", env.master_port, timeout);
    } catch (const hp::Error& e) {
      HP_FAIL() << who << ": " << e.what();
    } catch (const std::exception& e) {
      HP_FAIL() << who << ": cannot start the rendezvous store on port " << env.master_port << ": " << e.what();
    }
  }
  return join_store(host, env.master_port, timeout, who + " (rank 0 hosts the store; did it start?)");
}

}  // namespace hp::comm
