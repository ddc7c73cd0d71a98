#include "fault_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

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

std::string errno_text(const std::string& call) { return call + ": " + std::strerror(errno); }

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
  std::random_device random;
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
    name = std::string(kNamePrefix) + suffix;
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) {
      error = errno_text("shm_open(" + name + ")");
      return nullptr;
    }
  }
  if (fd < 0) {
    error = "shm_open: no free name after 16 attempts";
    return nullptr;
  }
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    error = errno_text("ftruncate");
  } else if (base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             base == MAP_FAILED) {
    error = errno_text("mmap");
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  // ftruncate zero-fills: no rank has posted.
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
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    error = errno_text("shm_open(" + name + ")");
    return nullptr;
  }
  struct stat info {};
  void* base = MAP_FAILED;
  if (fstat(fd, &info) != 0) {
    error = errno_text("fstat(" + name + ")");
  } else if (static_cast<std::size_t>(info.st_size) != bytes) {
    error = name + " has " + std::to_string(info.st_size) + " bytes, not the " +
            std::to_string(bytes) + " of a board for " + std::to_string(world_size) + " ranks";
  } else if (base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
             base == MAP_FAILED) {
    error = errno_text("mmap(" + name + ")");
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
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
