// mnnvl's file-descriptor exchange (what carries cuMem POSIX handles between
// the ranks of one host), on plain pipes: every rank's descriptor reaches
// every other rank and still refers to the same pipe; ranks that offer none
// get none; a rank that never arrives fails the others within the deadline;
// a local stranger that finds the socket by name gets nothing.
#define BOOST_TEST_MODULE backends_mnnvl_fd_exchange
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fd_exchange.h"
#include "thread_oob.h"

namespace {

struct Pipe {
  int read = -1;
  int write = -1;
  Pipe() {
    int fds[2];
    BOOST_REQUIRE(pipe(fds) == 0);
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    close(read);
    close(write);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_rank_receives_every_other_ranks_descriptor) {
  constexpr int kRanks = 4;
  std::vector<Pipe> pipes(kRanks);
  arbiter::test::ThreadGroup group(kRanks);
  std::vector<std::vector<int>> received(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const arbiter_oob oob = group.oob(r);
      // Rank 3 offers nothing: the others get -1 for it.
      const int offer = r == 3 ? -1 : pipes[r].write;
      const auto s = arbiter::mnnvl::exchange_fds(oob, offer, &received[r], 10000);
      if (!s.ok()) errors[r] = s.message();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(errors[r].empty(), errors[r]);
      BOOST_REQUIRE_EQUAL(received[r].size(), std::size_t{kRanks});
      for (int q = 0; q < kRanks; ++q) {
        const int fd = received[r][q];
        if (q == r || q == 3) {
          BOOST_TEST(fd == -1);
          continue;
        }
        BOOST_REQUIRE(fd >= 0);
        // The received descriptor writes into rank q's pipe.
        const char byte = static_cast<char>('a' + r);
        BOOST_TEST(write(fd, &byte, 1) == 1);
        close(fd);
      }
    }
  }
  for (int q = 0; q < 3; ++q) {
    // Three ranks (all but q itself) wrote one byte each into q's pipe.
    char bytes[8] = {};
    BOOST_TEST(read(pipes[q].read, bytes, sizeof bytes) == 3);
  }
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_arrives_fails_the_others_in_time) {
  Pipe p;
  arbiter::test::ThreadGroup group(3);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    threads.emplace_back([&, r] {
      std::vector<int> received;
      const auto s = arbiter::mnnvl::exchange_fds(group.oob(r), p.write, &received, 500);
      errors[r] = s.ok() ? "" : s.message();
    });
  }
  for (auto& t : threads) t.join();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  BOOST_TEST(waited < 5000);
  for (const std::string& e : errors) {
    BOOST_TEST(e.find("did not arrive") != std::string::npos, e);
  }
}

namespace {

// Rank 1's oob, its second allgather (the "ready" one) held back: rank 0
// listens meanwhile, so a stranger has time to connect first.
struct HeldBack {
  arbiter_oob inner;
  int calls = 0;
  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes,
                           int64_t timeout_ms) {
    auto& self = *static_cast<HeldBack*>(ctx);
    if (++self.calls == 2) std::this_thread::sleep_for(std::chrono::milliseconds(700));
    return self.inner.allgather(self.inner.ctx, send, recv, bytes, timeout_ms);
  }
  arbiter_oob oob() {
    arbiter_oob o = inner;
    o.ctx = this;
    o.allgather = allgather;
    o.broadcast = [](void* ctx, void* buf, size_t bytes, int32_t root, int64_t t) {
      auto& self = *static_cast<HeldBack*>(ctx);
      return self.inner.broadcast(self.inner.ctx, buf, bytes, root, t);
    };
    o.barrier = [](void* ctx, int64_t t) {
      auto& self = *static_cast<HeldBack*>(ctx);
      return self.inner.barrier(self.inner.ctx, t);
    };
    o.last_error = [](void* ctx) {
      auto& self = *static_cast<HeldBack*>(ctx);
      return self.inner.last_error(self.inner.ctx);
    };
    return o;
  }
};

// A local process that finds the socket by its name (/proc/net/unix lists
// abstract names to everyone) and asks for rank 1's handle; -1 unless it got
// a descriptor.
int stranger_asks(std::chrono::steady_clock::time_point until) {
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream table("/proc/net/unix");
    for (std::string line; std::getline(table, line);) {
      const auto at = line.find("@arbiter-mnnvl-");
      if (at == std::string::npos) continue;
      const std::string name = line.substr(at + 1);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::memcpy(a.sun_path + 1, name.data(), name.size());
      const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      const int s = socket(AF_UNIX, SOCK_STREAM, 0);
      if (connect(s, reinterpret_cast<const sockaddr*>(&a), length) != 0) {
        close(s);
        continue;
      }
      // What a rank sends: its rank (1), and 16 bytes it can only guess.
      const std::int32_t guess[6] = {1, 0, 0, 0, 0, 0};
      (void)send(s, guess, sizeof guess, MSG_NOSIGNAL);
      char byte = 0;
      iovec io{&byte, 1};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msghdr header{};
      header.msg_iov = &io;
      header.msg_iovlen = 1;
      header.msg_control = control;
      header.msg_controllen = sizeof control;
      pollfd p{s, POLLIN, 0};
      int got = -1;
      if (poll(&p, 1, 3000) > 0 && recvmsg(s, &header, 0) == 1 && CMSG_FIRSTHDR(&header)) {
        std::memcpy(&got, CMSG_DATA(CMSG_FIRSTHDR(&header)), sizeof got);
      }
      close(s);
      return got;
    }
  }
  return -1;
}

}  // namespace

// The socket's name is visible to every local process: one that connected
// first got the handle (which maps a workspace's memory) and took the real
// peer's turn, whose fetch then failed at the deadline. The handle goes
// only to a rank presenting the exchange's secret (sent over the oob).
BOOST_AUTO_TEST_CASE(a_stranger_that_finds_the_socket_gets_no_handle_and_holds_nothing_up) {
  Pipe p;
  arbiter::test::ThreadGroup group(2);
  HeldBack held{group.oob(1)};
  std::vector<std::string> errors(2);
  std::vector<std::vector<int>> received(2);
  int stolen = -1;
  std::thread stranger(
      [&] { stolen = stranger_asks(std::chrono::steady_clock::now() + std::chrono::seconds(3)); });
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const arbiter_oob oob = r == 1 ? held.oob() : group.oob(r);
      const auto s = arbiter::mnnvl::exchange_fds(oob, r == 0 ? p.write : -1, &received[r], 5000);
      errors[r] = s.ok() ? "" : s.message();
    });
  }
  for (auto& t : ranks) t.join();
  stranger.join();
  BOOST_TEST(stolen == -1);
  if (stolen >= 0) close(stolen);
  BOOST_TEST(errors[0].empty(), errors[0]);
  BOOST_TEST(errors[1].empty(), errors[1]);
  BOOST_REQUIRE(received[1].size() == 2u);
  BOOST_TEST(received[1][0] >= 0);
  if (received[1][0] >= 0) close(received[1][0]);
}
