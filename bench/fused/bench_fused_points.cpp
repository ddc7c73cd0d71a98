// Points and buffers of arbiter-bench-fused; see bench_fused_points.h.
#include "bench_fused_points.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "bench_fused_kernels.h"
#include "bench_fused_timing.h"

namespace arbiter::bench {

std::vector<std::uint32_t> token_counts(const Options& o, std::uint32_t hidden) {
  std::vector<std::uint32_t> tokens;
  const std::uint64_t row = std::uint64_t{hidden} * kElementBytes;
  for (std::uint64_t b = o.min_bytes; b <= o.max_bytes; b *= o.size_step) {
    const std::uint32_t t = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, b / row));
    if (tokens.empty() || tokens.back() != t) tokens.push_back(t);
    if (b > o.max_bytes / o.size_step) break;
  }
  return tokens;
}

bool DeviceBuffer::allocate(std::size_t bytes) {
  reset();
  if (cudaMalloc(&p_, bytes) != cudaSuccess) {
    p_ = nullptr;
    cudaGetLastError();
    return false;
  }
  return true;
}

void DeviceBuffer::reset() {
  if (p_ != nullptr) cudaFree(p_);
  p_ = nullptr;
}

bool ShapeBuffers::allocate(int ws, std::uint32_t hidden, std::uint32_t tokens) {
  const std::size_t bytes = std::size_t{tokens} * hidden * kElementBytes;
  ranks_.clear();
  ranks_.resize(ws);
  bool ok = gamma_.allocate(std::size_t{hidden} * kElementBytes) &&
            counts_.allocate(4 * sizeof(unsigned long long));
  for (RankBuffers& b : ranks_) {
    for (DeviceBuffer* d : {&b.input, &b.residual_in, &b.residual_out, &b.norm_out, &b.sum,
                            &b.ref_residual_out, &b.ref_norm_out}) {
      ok = ok && d->allocate(bytes);
    }
  }
  if (!ok) clear();
  return ok;
}

void ShapeBuffers::fill(std::uint32_t hidden, std::uint32_t tokens) {
  const std::size_t count = std::size_t{tokens} * hidden;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    const auto seed = static_cast<std::uint32_t>(r);
    check(fill_bf16(ranks_[r].input.get(), count, 2 * seed + 1, -2.0f, 0.125f, 33, nullptr),
          "fill");
    check(
        fill_bf16(ranks_[r].residual_in.get(), count, 1000 + seed, -1.0f, 1.0f / 64, 129, nullptr),
        "fill");
  }
  check(fill_bf16(gamma_.get(), hidden, 77, 0.5f, 1.0f / 128, 129, nullptr), "fill");
  check(cudaDeviceSynchronize(), "fill");
}

void ShapeBuffers::clear() {
  ranks_.clear();
  gamma_.reset();
  counts_.reset();
}

}  // namespace arbiter::bench
