#include "fault_board.h"

#include <sys/mman.h>
#include <unistd.h>

#include "arbiter/common/shm_object.h"

namespace arbiter {

namespace {

// Under shm's prefix, so the leak checks of arbiter's fault tests see it.
constexpr const char* kNamePrefix = "/arbiter-shm-board-";

static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the board's words are shared between processes");

std::size_t board_bytes(std::uint32_t world_size) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t words = std::size_t{world_size} * sizeof(std::uint64_t);
  return (words + page - 1) / page * page;
}

// A post: the status in the low byte, the call + 1 above it (0: none).
constexpr std::uint64_t encode(arbiter_status status, std::optional<std::uint64_t> call) {
  return (call ? (*call + 1) << 8 : 0) | static_cast<std::uint8_t>(status);
}

}  // namespace

const char* fault_words(arbiter_status status) {
  switch (status) {
    case ARBITER_TIMEOUT:
      return "timed out";
    case ARBITER_PEER_FAILED:
      return "failed because a peer did (ARBITER_PEER_FAILED)";
    case ARBITER_INTERNAL:
      return "failed (ARBITER_INTERNAL: a launch or a library call failed)";
    case ARBITER_ABORTED:
      return "was aborted";
    default:
      return "failed";
  }
}

std::unique_ptr<FaultBoard> FaultBoard::create(std::uint32_t world_size, std::string& error) try {
  const std::size_t bytes = board_bytes(world_size);
  std::string name;
  void* base = nullptr;
  // The object starts zero-filled: no rank has posted.
  if (const common::Status status = common::create_shm_object(kNamePrefix, bytes, "", name, &base);
      !status.ok()) {
    error = status.message();
    return nullptr;
  }
  return std::unique_ptr<FaultBoard>(new FaultBoard(name, base, bytes, true));
} catch (const std::exception& e) {
  // std::random_device without entropy, or memory: no board, as any
  // failure here (the board is never a reason to refuse a communicator).
  error = e.what();
  return nullptr;
}

std::unique_ptr<FaultBoard> FaultBoard::open(const std::string& name, std::uint32_t world_size,
                                             std::string& error) {
  const std::size_t bytes = board_bytes(world_size);
  void* base = nullptr;
  if (const common::Status status =
          common::map_shm_object(name, bytes, ARBITER_MISMATCH,
                                 "not the " + std::to_string(bytes) + " of a board for " +
                                     std::to_string(world_size) + " ranks",
                                 &base);
      !status.ok()) {
    error = status.message();
    return nullptr;
  }
  return std::unique_ptr<FaultBoard>(new FaultBoard(name, base, bytes, false));
}

FaultBoard::~FaultBoard() {
  unlink();
  munmap(base_, bytes_);
}

void FaultBoard::unlink() noexcept {
  if (!owner_ || unlinked_) return;
  shm_unlink(name_.c_str());
  unlinked_ = true;
}

void FaultBoard::post(std::int32_t rank, arbiter_status status,
                      std::optional<std::uint64_t> call) noexcept {
  if (status == ARBITER_OK || !has_word(rank)) return;
  std::uint64_t empty = 0;
  words()[rank].compare_exchange_strong(empty, encode(status, call), std::memory_order_release,
                                        std::memory_order_relaxed);
}

std::optional<FaultBoard::Post> FaultBoard::posted(
    const std::vector<std::int32_t>& ranks) const noexcept {
  std::optional<Post> found;
  for (const std::int32_t r : ranks) {
    if (!has_word(r)) continue;
    const std::uint64_t word = words()[r].load(std::memory_order_acquire);
    if (word == 0) continue;
    Post p;
    p.rank = r;
    p.status = static_cast<arbiter_status>(word & 0xff);
    if (word >> 8 != 0) p.call = (word >> 8) - 1;
    if (p.status != ARBITER_PEER_FAILED) return p;
    if (!found) found = p;
  }
  return found;
}

}  // namespace arbiter
