#include "bench_check.h"

#include <algorithm>

#include "arbiter/common/numeric.h"
#include "arbiter/common/nvfp4.h"

namespace arbiter::cli::bench {
namespace {

arbiter_dtype abi(Dtype d) { return static_cast<arbiter_dtype>(d); }

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void fill_sample(void* out, std::size_t count, Dtype dtype, std::uint32_t id) {
  const std::uint64_t base = std::uint64_t{id} << 40;
  for (std::size_t i = 0; i < count; ++i) {
    const auto step = static_cast<int>(mix(base + i) % 2001) - 1000;  // multiples of 1/400
    common::store_element(out, i, abi(dtype), static_cast<float>(step) / 400.0f);
  }
}

OutputSizes output_sizes(const Point& p) {
  const std::size_t elements = std::size_t{p.tokens} * p.hidden;
  const std::size_t bytes = p.bytes;
  OutputSizes s;
  switch (p.pattern) {
    case Pattern::kAllreduce:
      s.allreduce_out = bytes;
      break;
    case Pattern::kResidualRmsnorm:
      s.residual_out = bytes;
      s.norm_out = bytes;
      break;
    case Pattern::kResidualRmsnormFp8:
      s.residual_out = bytes;
      s.quant_out = elements;
      break;
    case Pattern::kResidualRmsnormFp4:
      s.residual_out = bytes;
      s.quant_out = (elements + 1) / 2;
      s.scale_out = common::swizzled_128x4_bytes(p.tokens, common::nvfp4_blocks_per_row(p.hidden));
      break;
  }
  return s;
}

OutputSizes largest_outputs(const std::vector<Point>& points) {
  OutputSizes m;
  for (const Point& p : points) {
    const OutputSizes s = output_sizes(p);
    m.allreduce_out = std::max(m.allreduce_out, s.allreduce_out);
    m.residual_out = std::max(m.residual_out, s.residual_out);
    m.norm_out = std::max(m.norm_out, s.norm_out);
    m.quant_out = std::max(m.quant_out, s.quant_out);
    m.scale_out = std::max(m.scale_out, s.scale_out);
  }
  return m;
}

arbiter_allreduce_args make_args(const Point& p, const Buffers& b) {
  arbiter_allreduce_args a{};
  a.pattern = static_cast<arbiter_pattern>(p.pattern);
  a.dtype = abi(p.dtype);
  a.algorithm = ARBITER_ALGORITHM_NATIVE;
  a.tokens = p.tokens;
  a.hidden = p.hidden;
  a.input = b.input;
  a.eps = kEps;
  a.weight_bias = 0.0f;
  if (p.residual_replicated && p.pattern != Pattern::kAllreduce) {
    a.flags |= ARBITER_RUN_RESIDUAL_REPLICATED;
  }
  const OutputSizes s = output_sizes(p);
  if (p.pattern == Pattern::kAllreduce) {
    a.allreduce_out = b.allreduce_out;
    return a;
  }
  a.residual_in = b.residual_in;
  a.gamma = b.gamma;
  a.residual_out = b.residual_out;
  if (s.norm_out) a.norm_out = b.norm_out;
  if (s.quant_out) {
    a.quant_out = b.quant_out;
    a.scale = b.scale;
  }
  if (s.scale_out) a.scale_out = b.scale_out;
  return a;
}

Reference::Reference(const Point& p, int world_size) : point_(p) {
  const std::size_t elements = std::size_t{p.tokens} * p.hidden;
  const std::size_t elt = static_cast<std::size_t>(element_size(p.dtype));
  for (int r = 0; r < world_size; ++r) {
    inputs_.emplace_back(elements * elt);
    fill_sample(inputs_.back().data(), elements, p.dtype, static_cast<std::uint32_t>(r));
  }
  residual_.resize(elements * elt);
  fill_sample(residual_.data(), elements, p.dtype, kResidualStream);
  gamma_.resize(std::size_t{p.hidden} * elt);
  fill_sample(gamma_.data(), p.hidden, p.dtype, kGammaStream);
  case_.pattern = static_cast<arbiter_pattern>(p.pattern);
  case_.dtype = abi(p.dtype);
  case_.tokens = p.tokens;
  case_.hidden = p.hidden;
  for (const auto& in : inputs_) case_.inputs.push_back(in.data());
  case_.residual_in = residual_.data();
  case_.gamma = gamma_.data();
  case_.eps = kEps;
  case_.weight_bias = 0.0f;
  case_.scale = kQuantScale;
  case_.linear_scales = false;
  ref_ = common::compute_reference(case_);
}

std::string Reference::check(const Outputs& got) const {
  const arbiter_dtype dtype = abi(point_.dtype);
  const std::uint32_t hidden = point_.hidden;
  switch (point_.pattern) {
    case Pattern::kAllreduce:
      return common::check_output(got.allreduce_out.data(), dtype, ref_.sum, ref_.sum_bound, hidden,
                                  "allreduce_out");
    case Pattern::kResidualRmsnorm:
      if (std::string e = common::check_output(got.residual_out.data(), dtype, ref_.residual,
                                               ref_.residual_bound, hidden, "residual_out");
          !e.empty()) {
        return e;
      }
      return common::check_output(got.norm_out.data(), dtype, ref_.norm, ref_.norm_bound, hidden,
                                  "norm_out");
    case Pattern::kResidualRmsnormFp8:
    case Pattern::kResidualRmsnormFp4:
      if (std::string e = common::check_output(got.residual_out.data(), dtype, ref_.residual,
                                               ref_.residual_bound, hidden, "residual_out");
          !e.empty()) {
        return e;
      }
      if (point_.pattern == Pattern::kResidualRmsnormFp8) {
        return common::check_fp8(got.quant_out.data(), ref_, kQuantScale, hidden);
      }
      return common::check_nvfp4(got.quant_out.data(), got.scale_out.data(), case_, ref_);
  }
  return "unknown pattern";
}

}  // namespace arbiter::cli::bench
