// One rank's abort flag for the GPU modules: a word of host-mapped pinned
// memory that the kernels poll while they wait on a peer (Spin in
// cuda/device_ops.cuh: every 1024 failed polls, never on the fast path) and
// that the module's abort() sets with a plain host store, from any thread,
// without a CUDA call that could block behind a hung kernel. As NCCL does
// for ncclCommAbort. Host only.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "arbiter/common/cuda_host.h"
#include "arbiter/common/status.h"

namespace arbiter::common {

class AbortFlag {
 public:
  AbortFlag() = default;
  ~AbortFlag() {
    if (host_ != nullptr) cudaFreeHost(host_);
  }
  AbortFlag(const AbortFlag&) = delete;
  AbortFlag& operator=(const AbortFlag&) = delete;

  // Allocates the word, cleared, mapped for every device (the current one's
  // context must exist).
  Status allocate() {
    void* host = nullptr;
    cudaError_t e =
        cudaHostAlloc(&host, sizeof(std::uint32_t), cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status(ARBITER_UNAVAILABLE,
                    cuda_message("cudaHostAlloc of the abort flag (host-mapped memory)", e));
    }
    host_ = static_cast<std::uint32_t*>(host);
    *host_ = 0;
    void* device = nullptr;
    e = cudaHostGetDevicePointer(&device, host, 0);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status(ARBITER_UNAVAILABLE,
                    cuda_message("cudaHostGetDevicePointer of the abort flag", e));
    }
    device_ = static_cast<const std::uint32_t*>(device);
    return Status();
  }

  // Thread-safe, never blocks: kernels polling the flag stop waiting.
  void raise() noexcept {
    raised_.store(true, std::memory_order_release);
    if (host_ != nullptr)
      std::atomic_ref<std::uint32_t>(*host_).store(1, std::memory_order_seq_cst);
  }
  bool raised() const noexcept { return raised_.load(std::memory_order_acquire); }

  // What the kernels poll (NULL before allocate()).
  const std::uint32_t* device() const { return device_; }

 private:
  std::uint32_t* host_ = nullptr;
  const std::uint32_t* device_ = nullptr;
  std::atomic<bool> raised_{false};
};

}  // namespace arbiter::common
