// The host's fault board (runtime/src/fault_board.h): what a rank posts is
// seen by a process that mapped the board, the first post stays, a post
// that merely echoes a peer's fault yields to the one where it began, and
// the name is gone from /dev/shm once the creator unlinks it while the
// mappings keep working.
#define BOOST_TEST_MODULE runtime_fault_board
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "fault_board.h"

using arbiter::FaultBoard;

namespace {

bool in_dev_shm(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);  // name starts with '/'
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_post_in_another_process_is_seen_and_the_first_post_stays) {
  std::string error;
  auto board = FaultBoard::create(3, error);
  BOOST_TEST_REQUIRE(board != nullptr, error);
  BOOST_TEST(in_dev_shm(board->name()));
  BOOST_TEST(!board->posted({1, 2}).has_value());

  const pid_t child = fork();
  BOOST_TEST_REQUIRE(child >= 0);
  if (child == 0) {
    std::string e;
    auto mapped = FaultBoard::open(board->name(), 3, e);
    if (!mapped) _exit(2);
    mapped->post(2, ARBITER_INTERNAL, 41);
    mapped->post(2, ARBITER_ABORTED, std::nullopt);  // the first post stays
    _exit(0);
  }
  int status = 0;
  BOOST_TEST_REQUIRE(waitpid(child, &status, 0) == child);
  BOOST_TEST_REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  const auto post = board->posted({1, 2});
  BOOST_TEST_REQUIRE(post.has_value());
  BOOST_TEST(post->rank == 2);
  BOOST_TEST(post->status == ARBITER_INTERNAL);
  BOOST_TEST_REQUIRE(post->call.has_value());
  BOOST_TEST(*post->call == 41u);
  // A rank does not watch itself.
  BOOST_TEST(!board->posted({0, 1}).has_value());
}

BOOST_AUTO_TEST_CASE(an_echo_of_a_peers_fault_yields_to_the_fault_where_it_began) {
  std::string error;
  auto board = FaultBoard::create(4, error);
  BOOST_TEST_REQUIRE(board != nullptr, error);
  board->post(1, ARBITER_PEER_FAILED, 7);  // rank 1 heard of rank 3's fault
  auto post = board->posted({1, 2, 3});
  BOOST_TEST_REQUIRE(post.has_value());
  BOOST_TEST(post->rank == 1);  // nothing better yet
  board->post(3, ARBITER_ABORTED, std::nullopt);
  post = board->posted({1, 2, 3});
  BOOST_TEST_REQUIRE(post.has_value());
  BOOST_TEST(post->rank == 3);
  BOOST_TEST(post->status == ARBITER_ABORTED);
  BOOST_TEST(!post->call.has_value());
  // Ranks outside the board are ignored, never read out of bounds.
  BOOST_TEST(!board->posted({4, 1000, -1}).has_value());
  board->post(1000, ARBITER_ABORTED, std::nullopt);
}

BOOST_AUTO_TEST_CASE(after_unlink_the_name_is_gone_and_the_mappings_still_work) {
  std::string error;
  auto board = FaultBoard::create(2, error);
  BOOST_TEST_REQUIRE(board != nullptr, error);
  const std::string name = board->name();
  auto peer = FaultBoard::open(name, 2, error);
  BOOST_TEST_REQUIRE(peer != nullptr, error);
  board->unlink();
  BOOST_TEST(!in_dev_shm(name));
  peer->post(1, ARBITER_TIMEOUT, 0);
  const auto post = board->posted({1});
  BOOST_TEST_REQUIRE(post.has_value());
  BOOST_TEST(post->status == ARBITER_TIMEOUT);
  BOOST_TEST(*post->call == 0u);
  // Opening by the name fails now, saying why.
  BOOST_TEST(FaultBoard::open(name, 2, error) == nullptr);
  BOOST_TEST(error.find(name) != std::string::npos, error);
}

BOOST_AUTO_TEST_CASE(a_board_for_another_world_size_is_refused_and_the_creator_cleans_up) {
  std::string error;
  std::string name;
  {
    auto board = FaultBoard::create(2, error);
    BOOST_TEST_REQUIRE(board != nullptr, error);
    name = board->name();
    // One rank more than a page holds words for needs two pages; the board
    // for 2 ranks has one (whatever the page size: 4 KiB, or 64 KiB on an
    // aarch64 Grace host).
    const auto ranks = static_cast<std::uint32_t>(sysconf(_SC_PAGESIZE) / 8 + 1);
    BOOST_TEST(FaultBoard::open(name, ranks, error) == nullptr);
    BOOST_TEST(
        error.find("of a board for " + std::to_string(ranks) + " ranks") != std::string::npos,
        error);
  }
  // Destroyed without unlink(): a creation that failed half-way.
  BOOST_TEST(!in_dev_shm(name));
}
