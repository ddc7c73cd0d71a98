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

// What a client sends first: its rank, and the exchange's secret. The
// socket's abstract name is visible to every local process
// (/proc/net/unix), the secret only to the job (it travels over the oob):
// without it nobody gets the handle, which maps the workspace's memory.
struct Request {
  std::int32_t rank;
  std::uint32_t pad;
  std::uint64_t secret[2];
};

// Serves `fd` to every rank in `expected`: each sends a Request, gets the
// fd. A connection without the secret, or for a rank served already or not
// expected, is closed and does not count; so is one that says nothing
// within a second (a stranger cannot hold the exchange up).
Status serve(int listener, int fd, std::vector<bool> expected, const std::uint64_t (&secret)[2],
             Clock::time_point deadline) {
  auto missing = [&] {
    std::string ranks;
    for (std::size_t r = 0; r < expected.size(); ++r) {
      if (expected[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    return ranks;
  };
  for (;;) {
    if (missing().empty()) return Status();
    if (!wait_for(listener, POLLIN, deadline)) {
      return Status(ARBITER_TIMEOUT,
                    "fd exchange: rank(s) " + missing() + " never connected to fetch the handle");
    }
    Socket conn(accept(listener, nullptr, nullptr));
    if (conn.get() < 0) return Status(ARBITER_INTERNAL, errno_text("fd exchange: accept"));
    Request request{};
    const Clock::time_point patience = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    if (!wait_for(conn.get(), POLLIN, patience) ||
        recv(conn.get(), &request, sizeof request, MSG_WAITALL) != sizeof request ||
        request.secret[0] != secret[0] || request.secret[1] != secret[1] || request.rank < 0 ||
        static_cast<std::size_t>(request.rank) >= expected.size() || !expected[request.rank]) {
      continue;  // not one of this exchange's ranks, or one served already
    }
    const std::int32_t rank = request.rank;
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
    expected[rank] = false;
  }
}

Status fetch(std::uint64_t nonce, const std::uint64_t (&secret)[2], int me, int rank, int* out,
             Clock::time_point deadline) {
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
  const Request request{me, 0, {secret[0], secret[1]}};
  if (send(s.get(), &request, sizeof request, MSG_NOSIGNAL) != sizeof request) {
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

  // Who offers a handle; from rank 0, a nonce for this exchange's socket
  // names and the secret a client must present.
  struct Offer {
    std::int32_t offers;
    std::uint32_t pad;
    std::uint64_t nonce;
    std::uint64_t secret[2];
  } mine{fd >= 0 ? 1 : 0, 0, 0, {0, 0}};
  if (me == 0) {
    std::random_device random;
    auto draw = [&] { return (std::uint64_t{random()} << 32) ^ random(); };
    mine.nonce = draw();
    mine.secret[0] = draw();
    mine.secret[1] = draw();
  }
  std::vector<Offer> offers(size);
  if (const std::int32_t rc = oob.allgather(oob.ctx, &mine, offers.data(), sizeof mine, timeout_ms);
      rc != ARBITER_OK) {
    return common::exchange_failed(oob, "allgather", rc);
  }
  const std::uint64_t nonce = offers[0].nonce;
  const std::uint64_t(&secret)[2] = offers[0].secret;

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
    std::vector<bool> expected(size, true);
    expected[me] = false;
    server = std::thread(
        [&, expected] { served = serve(listener.get(), fd, expected, secret, deadline); });
  }
  Status fetched;
  for (int r = 0; r < size && fetched.ok(); ++r) {
    if (r == me || offers[r].offers == 0) continue;
    fetched = fetch(nonce, secret, me, r, &(*received)[r], deadline);
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
