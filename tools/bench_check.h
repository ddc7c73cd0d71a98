// `arbiter bench`: the data every call is timed with, the buffers a call
// writes, and the check of a point's first call against the fp64 CPU
// reference (arbiter/common/reference.h), so that a broken backend cannot
// produce a pretty table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arbiter/common/reference.h"
#include "arbiter_backend.h"
#include "bench_sweep.h"

namespace arbiter::cli::bench {

// Sample streams: rank r's input is stream r; these are shared by all ranks.
inline constexpr std::uint32_t kResidualStream = 1u << 20;
inline constexpr std::uint32_t kGammaStream = (1u << 20) + 1;
// Every call's epilogue constants (FP8: the dequant scale; NVFP4: the global
// scale; NVFP4 block scales in the 128x4 swizzled layout).
inline constexpr float kEps = 1e-6f;
inline constexpr float kQuantScale = 1.0f;

// Element i of stream `id` depends on (id, i) only: a prefix of a large
// buffer is the data of a smaller call, and any rank can compute every
// other rank's input for the reference. Values lie in [-2.5, 2.5].
void fill_sample(void* out, std::size_t count, Dtype dtype, std::uint32_t id);

// Where a call reads and writes (host or device pointers), each large
// enough for the largest point of the sweep.
struct Buffers {
  const void* input = nullptr;
  const void* residual_in = nullptr;
  const void* gamma = nullptr;
  const float* scale = nullptr;
  void* allreduce_out = nullptr;
  void* residual_out = nullptr;
  void* norm_out = nullptr;
  void* quant_out = nullptr;
  void* scale_out = nullptr;
};

// Bytes of each output a point's call writes (0: not written). allreduce:
// the sum; residual_rmsnorm: residual_out and norm_out; the quantising
// patterns: residual_out, quant_out (and NVFP4's scale_out).
struct OutputSizes {
  std::size_t allreduce_out = 0, residual_out = 0, norm_out = 0, quant_out = 0, scale_out = 0;
};
OutputSizes output_sizes(const Point& point);
// The largest of each over the points (what the buffers must hold).
OutputSizes largest_outputs(const std::vector<Point>& points);

// The arguments of `point`'s call over `buffers` (algorithm left native:
// run_on() sets it), with ARBITER_RUN_RESIDUAL_REPLICATED when the point's
// residual is replicated: every rank's residual_in is the same sample
// stream (kResidualStream), so the promise holds and the reference stands.
arbiter_allreduce_args make_args(const Point& point, const Buffers& buffers);

// What a call wrote, copied to the host; the vectors follow output_sizes().
struct Outputs {
  std::vector<std::uint8_t> allreduce_out, residual_out, norm_out, quant_out, scale_out;
};

// The reference of one point over `world_size` ranks' sample inputs,
// computed once and checked against every option's first call.
class Reference {
 public:
  Reference(const Point& point, int world_size);
  Reference(const Reference&) = delete;  // case_ points into the vectors
  Reference& operator=(const Reference&) = delete;
  // "" when every output is within the reference's bounds; otherwise the
  // first element that is not.
  std::string check(const Outputs& got) const;

 private:
  Point point_;
  std::vector<std::vector<std::uint8_t>> inputs_;
  std::vector<std::uint8_t> residual_, gamma_;
  common::ReferenceCase case_;
  common::ReferenceOutputs ref_;
};

}  // namespace arbiter::cli::bench
