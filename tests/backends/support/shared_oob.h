// A test-only arbiter_oob for ranks forked from one parent process, so
// backend tests need no bootstrap service.
//
// The parent creates a SharedOobArea (an anonymous shared mapping) before
// forking; each child wraps it in a SharedOob with its rank. Collectives are
// a generation-counting barrier around copies through per-rank slots. Every
// call honours its timeout and says how many ranks had arrived.
#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "arbiter/common/deadline.h"
#include "arbiter_backend.h"

namespace arbiter::test {

class SharedOobArea {
 public:
  static constexpr std::size_t kSlotBytes = 64 * 1024;

  explicit SharedOobArea(int ranks) : ranks_(ranks), bytes_(kHeader + ranks * kSlotBytes) {
    memory_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory_ == MAP_FAILED) throw std::runtime_error("mmap of the test oob area failed");
  }
  ~SharedOobArea() { munmap(memory_, bytes_); }
  SharedOobArea(const SharedOobArea&) = delete;
  SharedOobArea& operator=(const SharedOobArea&) = delete;

  int ranks() const { return ranks_; }
  std::uint32_t& arrived() { return static_cast<std::uint32_t*>(memory_)[0]; }
  std::uint32_t& generation() { return static_cast<std::uint32_t*>(memory_)[16]; }
  std::byte* slot(int rank) {
    return static_cast<std::byte*>(memory_) + kHeader + static_cast<std::size_t>(rank) * kSlotBytes;
  }

 private:
  static constexpr std::size_t kHeader = 4096;
  int ranks_;
  std::size_t bytes_;
  void* memory_;
};

class SharedOob {
 public:
  SharedOob(SharedOobArea& area, int rank) : area_(area) {
    oob_.ctx = this;
    oob_.rank = rank;
    oob_.size = area.ranks();
    oob_.allgather = &SharedOob::allgather;
    oob_.broadcast = &SharedOob::broadcast;
    oob_.barrier = &SharedOob::barrier;
    oob_.last_error = &SharedOob::last_error;
  }
  SharedOob(const SharedOob&) = delete;
  SharedOob& operator=(const SharedOob&) = delete;

  const arbiter_oob& oob() const { return oob_; }

 private:
  static SharedOob& self(void* ctx) { return *static_cast<SharedOob*>(ctx); }

  std::int32_t wait_all(std::int64_t timeout_ms) {
    std::atomic_ref<std::uint32_t> arrived(area_.arrived());
    std::atomic_ref<std::uint32_t> generation(area_.generation());
    const std::uint32_t mine = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
        static_cast<std::uint32_t>(oob_.size)) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(mine + 1, std::memory_order_release);
      return ARBITER_OK;
    }
    // Capped as the library caps its own waits.
    const auto deadline = arbiter::common::deadline_after(timeout_ms);
    for (int polls = 0; generation.load(std::memory_order_acquire) == mine; ++polls) {
      if (std::chrono::steady_clock::now() >= deadline) {
        error_ = "test oob: timed out after " + std::to_string(timeout_ms) + " ms with " +
                 std::to_string(arrived.load()) + " of " + std::to_string(oob_.size) +
                 " ranks arrived";
        return ARBITER_TIMEOUT;
      }
      if (polls < 100) {
        sched_yield();
      } else {
        const timespec pause{0, 50 * 1000};
        nanosleep(&pause, nullptr);
      }
    }
    return ARBITER_OK;
  }

  static std::int32_t allgather(void* ctx, const void* send, void* recv, std::size_t bytes,
                                std::int64_t timeout_ms) {
    SharedOob& oob = self(ctx);
    if (bytes > SharedOobArea::kSlotBytes) {
      oob.error_ = "test oob: allgather of " + std::to_string(bytes) + " bytes is too large";
      return ARBITER_INVALID_ARGUMENT;
    }
    std::memcpy(oob.area_.slot(oob.oob_.rank), send, bytes);
    if (const std::int32_t rc = oob.wait_all(timeout_ms); rc != ARBITER_OK) return rc;
    for (int rank = 0; rank < oob.oob_.size; ++rank) {
      std::memcpy(static_cast<std::byte*>(recv) + rank * bytes, oob.area_.slot(rank), bytes);
    }
    return oob.wait_all(timeout_ms);  // nobody overwrites a slot still being read
  }

  static std::int32_t broadcast(void* ctx, void* buf, std::size_t bytes, std::int32_t root,
                                std::int64_t timeout_ms) {
    SharedOob& oob = self(ctx);
    if (bytes > SharedOobArea::kSlotBytes) {
      oob.error_ = "test oob: broadcast of " + std::to_string(bytes) + " bytes is too large";
      return ARBITER_INVALID_ARGUMENT;
    }
    if (oob.oob_.rank == root) std::memcpy(oob.area_.slot(0), buf, bytes);
    if (const std::int32_t rc = oob.wait_all(timeout_ms); rc != ARBITER_OK) return rc;
    if (oob.oob_.rank != root) std::memcpy(buf, oob.area_.slot(0), bytes);
    return oob.wait_all(timeout_ms);
  }

  static std::int32_t barrier(void* ctx, std::int64_t timeout_ms) {
    return self(ctx).wait_all(timeout_ms);
  }

  static const char* last_error(void* ctx) { return self(ctx).error_.c_str(); }

  SharedOobArea& area_;
  arbiter_oob oob_{};
  std::string error_;
};

}  // namespace arbiter::test
