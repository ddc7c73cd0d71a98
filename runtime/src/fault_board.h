// A page of shared memory where the ranks of a GPU communicator on one host
// post their faults, so that a rank's abort() or failed call reaches its
// local peers within one watch period (peer_watch.h) instead of their
// kernels' deadline (ARBITER_KERNEL_TIMEOUT_MS, 10 minutes by default).
//
// GPU calls return once their kernels are enqueued; a rank that aborts, or
// whose launch fails after its peers launched, leaves the peers' kernels
// spinning on flags it will never write. Each rank owns one 64-bit word,
// indexed by its rank, written once (the first fault stays); peers only
// read it. The lowest rank of each host creates the object, every local
// rank maps it, and the creator unlinks the name once all have (so a crash
// afterwards leaves nothing in /dev/shm). CPU communicators need none: shm
// carries aborts and faults on the flags it already exchanges.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arbiter_backend.h"

namespace arbiter {

class FaultBoard {
 public:
  // What a rank posted. `call` is the failed call's number, when known
  // (abort() posts none: it may come from any thread, between calls).
  struct Post {
    std::int32_t rank = -1;
    arbiter_status status = ARBITER_OK;
    std::optional<std::uint64_t> call;
  };

  // A new board for `world_size` ranks under a fresh name, or nullptr with
  // `error` set.
  static std::unique_ptr<FaultBoard> create(std::uint32_t world_size, std::string& error);
  // The board another rank created, or nullptr with `error` set.
  static std::unique_ptr<FaultBoard> open(const std::string& name, std::uint32_t world_size,
                                          std::string& error);
  // Unmaps; the creator also unlinks the name if unlink() has not yet.
  ~FaultBoard();
  FaultBoard(const FaultBoard&) = delete;
  FaultBoard& operator=(const FaultBoard&) = delete;

  const std::string& name() const { return name_; }
  // The creator, once every local rank mapped the board.
  void unlink() noexcept;

  // Posts `rank`'s fault, unless it posted one already. Lock-free and
  // allocation-free: abort() calls it from any thread.
  void post(std::int32_t rank, arbiter_status status, std::optional<std::uint64_t> call) noexcept;
  // The fault posted by one of `ranks`, if any. A fault a rank posted
  // because of another's (ARBITER_PEER_FAILED) yields to one that started
  // there, so peers name the rank where it began.
  std::optional<Post> posted(const std::vector<std::int32_t>& ranks) const noexcept;

 private:
  FaultBoard(std::string name, void* base, std::size_t bytes, bool owner)
      : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner) {}
  // Whether the board has a word for `rank` (one a caller got wrong must
  // not touch memory past the mapping).
  bool has_word(std::int32_t rank) const {
    return rank >= 0 && static_cast<std::size_t>(rank) < bytes_ / sizeof(std::uint64_t);
  }
  std::atomic<std::uint64_t>* words() const {
    return static_cast<std::atomic<std::uint64_t>*>(base_);
  }

  std::string name_;
  void* base_;
  std::size_t bytes_;
  bool owner_;
  bool unlinked_ = false;
};

// The words used in messages for a status a rank may post: "aborted",
// "timed out", ...
const char* fault_words(arbiter_status status);

}  // namespace arbiter
