// free_bootstrap_port(): a MASTER_PORT for ranks a launcher starts on this
// host, picked where the kernel never assigns ports by itself.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "arbiter/bootstrap.h"

namespace arbiter {

namespace {

// Ports below it may be privileged or well known; the search stays above.
constexpr std::uint32_t kLowestPort = 10000;

// Binds 127.0.0.1:port (0: the kernel picks) without SO_REUSEADDR, so a
// port in use or held by a connection in TIME_WAIT fails. Returns the port
// bound, 0 when it is taken, and -errno when no socket can be made at all.
int try_bind(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  socklen_t length = sizeof address;
  int result = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    result = ntohs(address.sin_port);
  } else if (port == 0) {
    result = -errno;
  }
  ::close(fd);
  return result;
}

// The first port of the kernel's ephemeral range; Linux's default when the
// file cannot be read.
std::uint32_t ephemeral_start() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  std::uint32_t low = 0, high = 0;
  if (range >> low >> high && low > 0 && low <= 65535) return low;
  return 32768;
}

}  // namespace

std::uint16_t free_bootstrap_port() {
  const std::uint32_t end = ephemeral_start();
  if (end > kLowestPort + 1) {
    const std::uint32_t count = end - kLowestPort;
    std::uint32_t start = 0;
    if (getrandom(&start, sizeof start, GRND_NONBLOCK) != sizeof start) {
      // No entropy yet: the process, the clock and a count of calls, so
      // that two calls of one process still start apart.
      static std::atomic<std::uint32_t> calls{0};
      const auto now =
          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
      const std::uint32_t mixed =
          (static_cast<std::uint32_t>(::getpid()) + calls.fetch_add(1) * 7919u) * 2654435761u;
      start = mixed ^ static_cast<std::uint32_t>(now ^ (now >> 32));
    }
    // At most 64 tries: a host with that many neighbours busy is unusual,
    // and the kernel's pick below still works there.
    for (std::uint32_t k = 0; k < count && k < 64; ++k) {
      const auto port = static_cast<std::uint16_t>(kLowestPort + (start + k) % count);
      if (try_bind(port) > 0) return port;
    }
  }
  const int picked = try_bind(0);
  if (picked <= 0) {
    throw BootstrapError(ARBITER_UNAVAILABLE,
                         std::string("cannot find a free port on 127.0.0.1: ") +
                             std::strerror(picked < 0 ? -picked : EADDRINUSE) +
                             " (hint: pass a port, e.g. `arbiter launch --port P`)");
  }
  return static_cast<std::uint16_t>(picked);
}

}  // namespace arbiter
