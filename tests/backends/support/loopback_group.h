// Loopback mode: N virtual ranks of one GPU backend module in this process,
// all on one GPU, each with its own workspace (a separate allocation) and
// its own stream. The module sees ranks of one process on one device and
// maps their workspaces directly (no IPC), sizing its grids so every rank's
// CTAs are resident at once. Lets the kernels run on a single-GPU machine.
//
// Creation and destruction are collective, so they run on N threads over an
// in-process oob (thread_oob.h). run() enqueues every rank's call from the
// calling thread, each on its rank's stream, before anything waits: a call is
// only complete once all ranks' kernels run together.
//
// No Boost: the GPU tests and benchmarks build where only CUDA is installed.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "arbiter_backend.h"
#include "thread_oob.h"

namespace arbiter::test {

// Call first thing in main(), before any CUDA call. Each virtual rank's
// kernel must run alongside the others; streams that share one of the
// device's hardware work queues serialise, so rank 8's kernel would wait
// behind rank 0's, which waits for rank 8's data: a deadlock. The default
// is 8 queues; 32 (the most) gives each of up to 16 ranks its own.
inline void prepare_loopback_environment() { setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1); }

class LoopbackGroup {
 public:
  static constexpr int kMaxLoopbackRanks = 32;

  // spec.rank is ignored (each virtual rank gets its own); spec.world_size
  // is the number of virtual ranks. Check ok() afterwards.
  LoopbackGroup(const arbiter_backend_v1_t& api, const arbiter_workspace_spec& spec)
      : api_(api), size_(spec.world_size), group_(spec.world_size > 0 ? spec.world_size : 1) {
    if (size_ < 1 || size_ > kMaxLoopbackRanks) {
      error_ = "loopback: world size " + std::to_string(size_) + " is outside 1.." +
               std::to_string(kMaxLoopbackRanks) +
               " (each virtual rank needs its own hardware work queue; a GPU has 32)";
      return;
    }
    if (const cudaError_t e = cudaSetDevice(spec.device); e != cudaSuccess) {
      error_ = std::string("loopback: cudaSetDevice: ") + cudaGetErrorString(e);
      return;
    }
    streams_.assign(size_, nullptr);
    for (cudaStream_t& s : streams_) {
      if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          e != cudaSuccess) {
        error_ = std::string("loopback: cudaStreamCreate: ") + cudaGetErrorString(e);
        return;
      }
    }
    workspaces_.assign(size_, nullptr);
    std::vector<std::int32_t> status(size_, ARBITER_INTERNAL);
    std::vector<std::string> reason(size_);
    oobs_.reserve(size_);
    for (int r = 0; r < size_; ++r) oobs_.push_back(group_.oob(r));
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        cudaSetDevice(spec.device);
        arbiter_workspace_spec mine = spec;
        mine.rank = r;
        status[r] = api_.workspace_create(&oobs_[r], &mine, &workspaces_[r]);
        if (status[r] != ARBITER_OK) reason[r] = api_.last_error();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < size_; ++r) {
      if (status[r] != ARBITER_OK && error_.empty()) {
        error_ = "rank " + std::to_string(r) + ": " + reason[r];
        status_ = status[r];
      }
    }
    // Creation is all or nothing: every rank must agree.
    for (int r = 0; r < size_; ++r) {
      if ((status[r] == ARBITER_OK) != (status[0] == ARBITER_OK)) {
        error_ += " (ranks disagreed: rank 0 " + std::to_string(status[0]) + ", rank " +
                  std::to_string(r) + " " + std::to_string(status[r]) + ")";
        disagreed_ = true;
        break;
      }
    }
    created_ = status[0] == ARBITER_OK && !disagreed_;
  }

  ~LoopbackGroup() {
    if (!hung_) {
      for (cudaStream_t s : streams_) {
        if (s != nullptr) cudaStreamSynchronize(s);
      }
      std::vector<std::thread> threads;
      for (int r = 0; r < size_ && r < static_cast<int>(workspaces_.size()); ++r) {
        if (workspaces_[r] == nullptr) continue;
        threads.emplace_back([this, r] { api_.workspace_destroy(workspaces_[r]); });
      }
      for (std::thread& t : threads) t.join();
    }
    for (cudaStream_t s : streams_) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }
  LoopbackGroup(const LoopbackGroup&) = delete;
  LoopbackGroup& operator=(const LoopbackGroup&) = delete;

  bool ok() const { return created_; }
  // Why creation failed (the first failing rank's message); empty when ok().
  const std::string& error() const { return error_; }
  std::int32_t status() const { return status_; }
  bool disagreed() const { return disagreed_; }
  int size() const { return size_; }
  arbiter_workspace* workspace(int rank) const { return workspaces_[rank]; }
  cudaStream_t stream(int rank) const { return streams_[rank]; }

  // Enqueues args[r] for every rank r on stream(r) (or streams[r] when given).
  // Returns ARBITER_OK, or the status every rank returned with rank 0's
  // message. When ranks disagree (some enqueued, some refused) the enqueued
  // kernels wait forever for their peers: returns ARBITER_INTERNAL and marks
  // the group hung, so it is never waited on or destroyed.
  std::int32_t run(const std::vector<arbiter_allreduce_args>& args, std::string* error,
                   const std::vector<cudaStream_t>* streams = nullptr) {
    std::vector<std::int32_t> status(size_);
    std::string first;
    for (int r = 0; r < size_; ++r) {
      status[r] = api_.run(workspaces_[r], &args[r], streams ? (*streams)[r] : streams_[r]);
      if (status[r] != ARBITER_OK && first.empty()) {
        first = "rank " + std::to_string(r) + ": " + api_.last_error();
      }
    }
    for (int r = 1; r < size_; ++r) {
      if ((status[r] == ARBITER_OK) != (status[0] == ARBITER_OK)) {
        hung_ = true;
        if (error) {
          *error = "ranks disagreed on run(): rank 0 returned " + std::to_string(status[0]) +
                   ", rank " + std::to_string(r) + " " + std::to_string(status[r]) + " (" + first +
                   ")";
        }
        return ARBITER_INTERNAL;
      }
    }
    if (status[0] != ARBITER_OK && error) *error = first;
    return status[0];
  }

  // Registered memory (ABI v2): alloc() on every rank at once (it is
  // collective), each on its own thread. Returns rank 0's status (with its
  // message), or ARBITER_INTERNAL when the ranks disagreed; parts[r] is
  // rank r's part.
  std::int32_t alloc_registered(const arbiter_backend_memory_v2_t& memory, std::uint64_t bytes,
                                std::vector<void*>* parts, std::string* error) {
    parts->assign(size_, nullptr);
    std::vector<std::int32_t> status(size_, ARBITER_INTERNAL);
    std::vector<std::string> reason(size_);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        status[r] = memory.alloc(workspaces_[r], bytes, &(*parts)[r]);
        if (status[r] != ARBITER_OK) reason[r] = api_.last_error();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < size_; ++r) {
      if (status[r] != status[0]) {
        if (error)
          *error = "ranks disagreed on alloc: rank 0 " + std::to_string(status[0]) + ", rank " +
                   std::to_string(r) + " " + std::to_string(status[r]);
        return ARBITER_INTERNAL;
      }
    }
    if (status[0] != ARBITER_OK && error) *error = reason[0];
    return status[0];
  }

  // run() as above, through the memory companion's run_registered().
  std::int32_t run_registered(const arbiter_backend_memory_v2_t& memory,
                              const std::vector<arbiter_allreduce_args>& args, std::string* error,
                              const std::vector<cudaStream_t>* streams = nullptr) {
    std::vector<std::int32_t> status(size_);
    std::string first;
    for (int r = 0; r < size_; ++r) {
      status[r] =
          memory.run_registered(workspaces_[r], &args[r], streams ? (*streams)[r] : streams_[r]);
      if (status[r] != ARBITER_OK && first.empty()) {
        first = "rank " + std::to_string(r) + ": " + api_.last_error();
      }
    }
    for (int r = 1; r < size_; ++r) {
      if ((status[r] == ARBITER_OK) != (status[0] == ARBITER_OK)) {
        hung_ = true;
        if (error) *error = "ranks disagreed on run_registered(): " + first;
        return ARBITER_INTERNAL;
      }
    }
    if (status[0] != ARBITER_OK && error) *error = first;
    return status[0];
  }

  // Waits for every rank's stream, at most `limit` in all. false with the
  // reason on a CUDA error or when the deadline passed (a kernel that never
  // finishes: the group is then hung and left alone).
  bool wait(std::chrono::milliseconds limit, std::string* error) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (int r = 0; r < size_; ++r) {
      for (;;) {
        const cudaError_t e = cudaStreamQuery(streams_[r]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
          if (error) *error = "rank " + std::to_string(r) + ": " + cudaGetErrorString(e);
          return false;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          hung_ = true;
          if (error) {
            *error = "rank " + std::to_string(r) + "'s stream did not finish within " +
                     std::to_string(limit.count()) + " ms (a kernel is hung)";
          }
          return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return true;
  }

  bool hung() const { return hung_; }

 private:
  const arbiter_backend_v1_t& api_;
  int size_;
  ThreadGroup group_;
  std::vector<arbiter_oob> oobs_;
  std::vector<arbiter_workspace*> workspaces_;
  std::vector<cudaStream_t> streams_;
  std::string error_;
  std::int32_t status_ = ARBITER_OK;
  bool created_ = false;
  bool disagreed_ = false;
  bool hung_ = false;
};

}  // namespace arbiter::test
