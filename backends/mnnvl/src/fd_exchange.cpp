#include "fd_exchange.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "arbiter/common/collective.h"
#include "arbiter/common/deadline.h"

namespace arbiter::mnnvl {
namespace {

using common::Status;
using Clock = std::chrono::steady_clock;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// "\0arbiter-mnnvl-<nonce>-<rank>": abstract, gone with the last descriptor.
sockaddr_un address_of(std::uint64_t nonce, int rank, socklen_t* length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const int n = std::snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "arbiter-mnnvl-%016llx-%d",
                              static_cast<unsigned long long>(nonce), rank);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return true;
    if (r == 0 || errno != EINTR) return false;
  }
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// One byte of payload with room for one descriptor (SCM_RIGHTS), as both
// ends of the exchange send and receive it. Points into itself: not copyable.
struct FdMessage {
  char byte = 0;
  iovec io{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr header{};

  FdMessage() {
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

// Serves `fd` to `clients` connections: each sends its rank, gets the fd.
Status serve(int listener, int fd, int clients, Clock::time_point deadline) {
  for (int served = 0; served < clients; ++served) {
    if (!wait_for(listener, POLLIN, deadline)) {
      return Status(ARBITER_TIMEOUT, "fd exchange: " + std::to_string(clients - served) +
                                         " rank(s) never connected to fetch the handle");
    }
    Socket conn(accept(listener, nullptr, nullptr));
    if (conn.get() < 0) return Status(ARBITER_INTERNAL, errno_text("fd exchange: accept"));
    std::int32_t rank = -1;
    if (!wait_for(conn.get(), POLLIN, deadline) ||
        recv(conn.get(), &rank, sizeof rank, MSG_WAITALL) != sizeof rank) {
      return Status(ARBITER_TIMEOUT, "fd exchange: a peer connected but sent no rank");
    }
    FdMessage message;
    message.byte = 'f';
    cmsghdr* c = CMSG_FIRSTHDR(&message.header);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(conn.get(), &message.header, MSG_NOSIGNAL) != 1) {
      return Status(ARBITER_INTERNAL,
                    errno_text("fd exchange: sendmsg") + " (to rank " + std::to_string(rank) + ")");
    }
  }
  return Status();
}

Status fetch(std::uint64_t nonce, int me, int rank, int* out, Clock::time_point deadline) {
  socklen_t length = 0;
  const sockaddr_un a = address_of(nonce, rank, &length);
  Socket s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.get() < 0) return Status(ARBITER_INTERNAL, errno_text("fd exchange: socket"));
  while (connect(s.get(), reinterpret_cast<const sockaddr*>(&a), length) != 0) {
    if (Clock::now() >= deadline) {
      return Status(ARBITER_TIMEOUT,
                    errno_text(("fd exchange: connect to rank " + std::to_string(rank)).c_str()) +
                        " (the ranks must share a host and network namespace)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::int32_t mine = me;
  if (send(s.get(), &mine, sizeof mine, MSG_NOSIGNAL) != sizeof mine) {
    return Status(ARBITER_INTERNAL, errno_text("fd exchange: send"));
  }
  FdMessage message;
  if (!wait_for(s.get(), POLLIN, deadline) ||
      recvmsg(s.get(), &message.header, MSG_CMSG_CLOEXEC) != 1) {
    return Status(ARBITER_TIMEOUT, "fd exchange: rank " + std::to_string(rank) +
                                       " sent no handle before the deadline");
  }
  const cmsghdr* c = CMSG_FIRSTHDR(&message.header);
  if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
    return Status(ARBITER_INTERNAL,
                  "fd exchange: rank " + std::to_string(rank) + " sent a message without a handle");
  }
  std::memcpy(out, CMSG_DATA(c), sizeof(int));
  return Status();
}

}  // namespace

Status exchange_fds(const arbiter_oob& oob, int fd, std::vector<int>* received,
                    std::int64_t timeout_ms) {
  const int size = oob.size;
  const int me = oob.rank;
  received->assign(size, -1);
  const auto deadline =
      common::deadline_after<Clock>(timeout_ms > 0 ? timeout_ms : 24LL * 3600 * 1000);

  // Who offers a handle, and a nonce for this exchange's socket names.
  struct Offer {
    std::int32_t offers;
    std::uint32_t pad;
    std::uint64_t nonce;
  } mine{fd >= 0 ? 1 : 0, 0, 0};
  if (me == 0) {
    std::random_device random;
    mine.nonce = (std::uint64_t{random()} << 32) ^ random();
  }
  std::vector<Offer> offers(size);
  if (const std::int32_t rc = oob.allgather(oob.ctx, &mine, offers.data(), sizeof mine, timeout_ms);
      rc != ARBITER_OK) {
    return common::exchange_failed(oob, "allgather", rc);
  }
  const std::uint64_t nonce = offers[0].nonce;

  // Listen before anyone connects (the barrier below).
  Socket listener(fd >= 0 ? socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1);
  Status local;
  if (fd >= 0) {
    socklen_t length = 0;
    const sockaddr_un a = address_of(nonce, me, &length);
    if (listener.get() < 0 ||
        bind(listener.get(), reinterpret_cast<const sockaddr*>(&a), length) != 0 ||
        listen(listener.get(), size) != 0) {
      local = Status(ARBITER_INTERNAL, errno_text("fd exchange: listen"));
    }
  }
  struct Ready {
    std::int32_t status;
    char reason[200];
  } ready{local.code(), {}};
  common::put_reason(ready, local.message());
  std::vector<Ready> all(size);
  if (const std::int32_t rc = oob.allgather(oob.ctx, &ready, all.data(), sizeof ready, timeout_ms);
      rc != ARBITER_OK) {
    return common::exchange_failed(oob, "allgather", rc);
  }
  if (Status s = common::verdict(all, me); !s.ok()) return s;

  Status served;
  std::thread server;
  if (fd >= 0) {
    server = std::thread([&] { served = serve(listener.get(), fd, size - 1, deadline); });
  }
  Status fetched;
  for (int r = 0; r < size && fetched.ok(); ++r) {
    if (r == me || offers[r].offers == 0) continue;
    fetched = fetch(nonce, me, r, &(*received)[r], deadline);
  }
  if (server.joinable()) server.join();
  Status outcome = !fetched.ok() ? fetched : served;
  // Everyone agrees, so a failure anywhere fails everywhere.
  ready.status = outcome.code();
  common::put_reason(ready, outcome.message());
  if (const std::int32_t rc = oob.allgather(oob.ctx, &ready, all.data(), sizeof ready, timeout_ms);
      rc != ARBITER_OK) {
    outcome = common::exchange_failed(oob, "allgather", rc);
  } else {
    outcome = common::verdict(all, me);
  }
  if (!outcome.ok()) {
    for (int& f : *received) {
      if (f >= 0) close(f);
      f = -1;
    }
  }
  return outcome;
}

}  // namespace arbiter::mnnvl
