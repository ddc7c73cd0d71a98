// What arbiter-bench-fused measures and with what: the sweep's points (one
// per world size, hidden size and token count, with the median of every
// option measured there) and each rank's device buffers for them.
//
// Sizes: per-rank bytes = tokens x hidden x 2 (bf16), tokens = max(1,
// bytes / row) for bytes from --min to --max in steps of x size_step, so the
// bytes reported are the real ones (14336 rather than 16384 at hidden 7168).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_fused_options.h"

namespace arbiter::bench {

inline constexpr std::uint32_t kElementBytes = 2;  // bf16

struct Point {  // one (ws, hidden, tokens)
  int ws = 0;
  std::uint32_t hidden = 0;
  std::uint32_t tokens = 0;
  std::uint64_t bytes = 0;
  // "baseline", "copy", and option_key(backend, algorithm) of each fused run.
  std::map<std::string, double> median_us;

  std::optional<double> median(const std::string& key) const {
    const auto it = median_us.find(key);
    return it == median_us.end() ? std::nullopt : std::optional<double>(it->second);
  }
};

// "trtllm oneshot", "mnnvl twoshot": a fused option's key in Point::median_us.
inline std::string option_key(const std::string& backend, const std::string& algorithm) {
  return backend + " " + algorithm;
}

// Token counts of the sweep for `hidden`: max(1, bytes / row), deduplicated.
std::vector<std::uint32_t> token_counts(const Options& o, std::uint32_t hidden);

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : p_(other.p_) { other.p_ = nullptr; }

  // false when the memory is not there (the error is cleared).
  bool allocate(std::size_t bytes);
  void reset();
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

struct RankBuffers {
  DeviceBuffer input, residual_in, residual_out, norm_out;  // the fused calls'
  DeviceBuffer sum, ref_residual_out, ref_norm_out;         // the baseline's
};

// Every rank's buffers for one (ws, hidden), sized for the largest point.
class ShapeBuffers {
 public:
  // Buffers for `tokens` tokens on `ws` ranks; false (all freed) when the
  // memory is not there.
  bool allocate(int ws, std::uint32_t hidden, std::uint32_t tokens);
  // Inputs are multiples of 1/8 in [-2, 2]: every partial sum of up to 16
  // of them is exact in fp32 and in bf16, so the sum (and residual_out) has
  // one right answer whatever order a kernel adds in. Synchronous; throws
  // Failure on a CUDA error.
  void fill(std::uint32_t hidden, std::uint32_t tokens);
  void clear();

  RankBuffers& rank(int r) { return ranks_[r]; }
  int ranks() const { return static_cast<int>(ranks_.size()); }
  void* gamma() const { return gamma_.get(); }
  // Device counters of the output comparison (4 values).
  unsigned long long* counts() const { return static_cast<unsigned long long*>(counts_.get()); }

 private:
  std::vector<RankBuffers> ranks_;
  DeviceBuffer gamma_;
  DeviceBuffer counts_;
};

}  // namespace arbiter::bench
