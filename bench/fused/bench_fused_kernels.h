// Helper kernels of arbiter-bench-fused (bench_fused_kernels.cu): test
// data, the unfused baseline's sum step, an output comparison and a delay
// that holds a stream while the host enqueues timed work. bf16 only. Every
// launcher enqueues one kernel on `stream` and returns the launch status; none
// allocates, so all of them may be captured into a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace arbiter::bench {

inline constexpr int kMaxBenchRanks = 16;

// Fills `count` bf16 elements from a hash of (seed, index): uniform over
// `levels` equally spaced values lo, lo + step, ..., i.e. lo + step * k for
// k < levels. With step = 1/8 and small lo every sum of a few of them is
// exact in fp32, whatever the order.
cudaError_t fill_bf16(void* out, std::size_t count, std::uint32_t seed, float lo, float step,
                      std::uint32_t levels, cudaStream_t stream);

// The baseline's sum: out[i] = bf16(sum over r < ranks, in rank order, of
// inputs[r][i]), accumulated in fp32, in 16-byte vectors (8 elements).
// REQUIRES: count % 8 == 0; every pointer 16-byte aligned; ranks <= 16.
struct SumArgs {
  const void* inputs[kMaxBenchRanks] = {};
  int ranks = 0;
  void* out = nullptr;
  std::size_t count = 0;  // elements
  int max_blocks = 0;     // grid cap (e.g. 4 x SM count); 0: no cap
};
cudaError_t sum_bf16(const SumArgs& args, cudaStream_t stream);

// Compares `count` bf16 elements of a against b and adds to counts[0] the
// elements whose bits differ (+0 and -0 count as equal) and to counts[1]
// those with |a - b| > rel * max(|a|, |b|) + abs or a NaN on one side only.
// counts is device memory (2 values), zeroed by the caller.
cudaError_t compare_bf16(const void* a, const void* b, std::size_t count, float rel, float abs,
                         unsigned long long* counts, cudaStream_t stream);

// One thread that spins for `microseconds` of GPU time (%globaltimer), so the
// work the host enqueues behind it starts together, after the host is done.
cudaError_t delay(std::uint32_t microseconds, cudaStream_t stream);

}  // namespace arbiter::bench
