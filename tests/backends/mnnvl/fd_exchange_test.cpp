// mnnvl's file-descriptor exchange (what carries cuMem POSIX handles between
// the ranks of one host), on plain pipes: every rank's descriptor reaches
// every other rank and still refers to the same pipe; ranks that offer none
// get none; a rank that never arrives fails the others within the deadline.
#define BOOST_TEST_MODULE backends_mnnvl_fd_exchange
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <chrono>
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
