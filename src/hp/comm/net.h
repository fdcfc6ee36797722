// Which local address talks to another host: what Gloo must listen on when the world
// spans hosts. The hostname is no guide: inside a container or a network namespace it
// often resolves to 127.0.0.1, which peers on other hosts cannot reach.
#pragma once

#include <string>

namespace hp::comm {

// The IPv4 address of this host's interface that routes to `host` (a name or an address):
// connect() a UDP socket there and read its local end; no packet is sent. Throws naming
// `host` when it does not resolve or no route leads to it.
std::string local_address_towards(const std::string& host, int port);

}  // namespace hp::comm
