#include "hp/comm/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hp/base/error.h"

namespace hp::comm {

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port > 0 ? port : 9);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  HP_CHECK(rc == 0 && found) << "cannot resolve MASTER_ADDR '" << host << "' to an IPv4 address: " << gai_strerror(rc);
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string err;
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (fd < 0) err = std::string("socket: ") + std::strerror(errno);
  else if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0) err = std::string("connect: ") + std::strerror(errno);
  else if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0)
    err = std::string("getsockname: ") + std::strerror(errno);
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  HP_CHECK(err.empty()) << "no route from this host to MASTER_ADDR '" << host << "' (" << err
                        << "); set GLOO_SOCKET_IFNAME to the interface Gloo should use";
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

}  // namespace hp::comm
