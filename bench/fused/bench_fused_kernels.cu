// Helper kernels of arbiter-bench-fused; see bench_fused_kernels.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "arbiter/common/numeric.h"
#include "bench_fused_kernels.h"

namespace arbiter::bench {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kVector = 8;  // bf16 elements in 16 bytes

__device__ inline std::uint32_t hash(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

__global__ void fill_kernel(std::uint16_t* out, std::size_t count, std::uint32_t seed, float lo,
                            float step, std::uint32_t levels) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint32_t h = hash(seed * 0x9E3779B9u ^ hash(static_cast<std::uint32_t>(i)) ^
                                 static_cast<std::uint32_t>(i >> 32));
    out[i] = common::float_to_bf16_bits(lo + step * static_cast<float>(h % levels));
  }
}

__global__ void __launch_bounds__(kThreads) sum_kernel(const SumArgs args) {
  const std::size_t vectors = args.count / kVector;
  for (std::size_t v = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; v < vectors;
       v += std::size_t{gridDim.x} * blockDim.x) {
    float acc[kVector];
    {
      const uint4 x = static_cast<const uint4*>(args.inputs[0])[v];
      const std::uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int k = 0; k < kVector; ++k) {
        acc[k] = common::bf16_bits_to_float(static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2))));
      }
    }
    for (int r = 1; r < args.ranks; ++r) {
      const uint4 x = static_cast<const uint4*>(args.inputs[r])[v];
      const std::uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int k = 0; k < kVector; ++k) {
        acc[k] +=
            common::bf16_bits_to_float(static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2))));
      }
    }
    std::uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[k] = common::float_to_bf16_bits(acc[2 * k]) |
             (static_cast<std::uint32_t>(common::float_to_bf16_bits(acc[2 * k + 1])) << 16);
    }
    static_cast<uint4*>(args.out)[v] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__global__ void compare_kernel(const std::uint16_t* a, const std::uint16_t* b, std::size_t count,
                               float rel, float abs, unsigned long long* counts) {
  unsigned long long differ = 0;
  unsigned long long beyond = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (a[i] == b[i] || ((a[i] | b[i]) & 0x7FFFu) == 0) continue;
    ++differ;
    const float x = common::bf16_bits_to_float(a[i]);
    const float y = common::bf16_bits_to_float(b[i]);
    const bool nan_x = x != x;
    const bool nan_y = y != y;
    if (nan_x || nan_y) {
      if (nan_x != nan_y) ++beyond;
      continue;
    }
    if (fabsf(x - y) > rel * fmaxf(fabsf(x), fabsf(y)) + abs) ++beyond;
  }
  if (differ != 0) atomicAdd(&counts[0], differ);
  if (beyond != 0) atomicAdd(&counts[1], beyond);
}

__global__ void delay_kernel(std::uint64_t nanoseconds) {
  std::uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    std::uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= nanoseconds) break;
  }
}

unsigned grid_for(std::size_t items, int max_blocks) {
  std::size_t blocks = (items + kThreads - 1) / kThreads;
  if (max_blocks > 0) blocks = std::min<std::size_t>(blocks, static_cast<std::size_t>(max_blocks));
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 0x7FFFFFFFu));
}

}  // namespace

cudaError_t fill_bf16(void* out, std::size_t count, std::uint32_t seed, float lo, float step,
                      std::uint32_t levels, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (levels == 0) return cudaErrorInvalidValue;
  fill_kernel<<<grid_for(count, 4096), kThreads, 0, stream>>>(static_cast<std::uint16_t*>(out),
                                                              count, seed, lo, step, levels);
  return cudaGetLastError();
}

cudaError_t sum_bf16(const SumArgs& args, cudaStream_t stream) {
  if (args.ranks < 1 || args.ranks > kMaxBenchRanks || args.count % kVector != 0) {
    return cudaErrorInvalidValue;
  }
  if (args.count == 0) return cudaSuccess;
  sum_kernel<<<grid_for(args.count / kVector, args.max_blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t compare_bf16(const void* a, const void* b, std::size_t count, float rel, float abs,
                         unsigned long long* counts, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  compare_kernel<<<grid_for(count, 1024), kThreads, 0, stream>>>(
      static_cast<const std::uint16_t*>(a), static_cast<const std::uint16_t*>(b), count, rel, abs,
      counts);
  return cudaGetLastError();
}

cudaError_t delay(std::uint32_t microseconds, cudaStream_t stream) {
  delay_kernel<<<1, 1, 0, stream>>>(std::uint64_t{microseconds} * 1000);
  return cudaGetLastError();
}

}  // namespace arbiter::bench
