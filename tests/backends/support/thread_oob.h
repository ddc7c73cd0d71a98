// An in-process arbiter_oob: `size` ranks are threads of one process that
// meet in a ThreadGroup. Every call has a deadline and, when it passes, says
// which ranks did not arrive, as the ABI asks of a host's oob.
//
// Thread-safety: each rank calls from its own thread; a ThreadGroup outlives
// every call. After a timeout the group is broken for good (tests make a new
// one).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "arbiter/common/deadline.h"
#include "arbiter_backend.h"

namespace arbiter::test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), arrived_(size, false), slots_(size) {
    ranks_.reserve(size);
    for (int r = 0; r < size; ++r) ranks_.push_back(Rank{this, r, {}});
  }
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  // The oob rank `rank` passes to workspace_create.
  arbiter_oob oob(int rank) {
    return arbiter_oob{&ranks_[rank], rank, size_, &allgather, &broadcast, &barrier, &last_error};
  }

 private:
  struct Rank {
    ThreadGroup* group;
    int rank;
    std::string error;
  };

  int32_t gather(Rank& self, const void* send, void* recv, std::size_t bytes, int64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) {
      self.error = "thread oob: the group broke in an earlier call";
      return ARBITER_INTERNAL;
    }
    const auto* in = static_cast<const unsigned char*>(send);
    slots_[self.rank].assign(in, in + bytes);
    arrived_[self.rank] = true;
    const std::uint64_t generation = generation_;
    if (++count_ == size_) {
      // Everyone is here: publish a snapshot and open the next generation.
      // Nobody can overwrite the snapshot before every rank has copied it out,
      // because the next generation needs every rank again.
      snapshot_ = slots_;
      count_ = 0;
      arrived_.assign(size_, false);
      ++generation_;
      cv_.notify_all();
    } else {
      const auto deadline = arbiter::common::deadline_after(timeout_ms);
      const bool done =
          timeout_ms <= 0
              ? (cv_.wait(lock, [&] { return generation_ != generation; }), true)
              : cv_.wait_until(lock, deadline, [&] { return generation_ != generation; });
      if (!done) {
        std::string missing;
        for (int r = 0; r < size_; ++r) {
          if (!arrived_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        broken_ = true;
        self.error = "thread oob: rank(s) " + missing + " did not arrive within " +
                     std::to_string(timeout_ms) + " ms";
        return ARBITER_TIMEOUT;
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (snapshot_[r].size() != bytes) {
        self.error = "thread oob: ranks passed different sizes";
        return ARBITER_INTERNAL;
      }
      if (recv != nullptr && bytes != 0) {
        std::memcpy(static_cast<unsigned char*>(recv) + r * bytes, snapshot_[r].data(), bytes);
      }
    }
    return ARBITER_OK;
  }

  static int32_t allgather(void* ctx, const void* send, void* recv, std::size_t bytes,
                           int64_t timeout_ms) {
    auto& self = *static_cast<Rank*>(ctx);
    return self.group->gather(self, send, recv, bytes, timeout_ms);
  }

  static int32_t broadcast(void* ctx, void* buf, std::size_t bytes, int32_t root,
                           int64_t timeout_ms) {
    auto& self = *static_cast<Rank*>(ctx);
    std::vector<unsigned char> all(bytes * self.group->size_);
    const int32_t rc = self.group->gather(self, buf, all.data(), bytes, timeout_ms);
    if (rc == ARBITER_OK && bytes != 0) std::memcpy(buf, all.data() + root * bytes, bytes);
    return rc;
  }

  static int32_t barrier(void* ctx, int64_t timeout_ms) {
    auto& self = *static_cast<Rank*>(ctx);
    return self.group->gather(self, nullptr, nullptr, 0, timeout_ms);
  }

  static const char* last_error(void* ctx) { return static_cast<Rank*>(ctx)->error.c_str(); }

  const int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int count_ = 0;
  bool broken_ = false;
  std::vector<bool> arrived_;
  std::vector<std::vector<unsigned char>> slots_;
  std::vector<std::vector<unsigned char>> snapshot_;
  std::vector<Rank> ranks_;
};

}  // namespace arbiter::test
