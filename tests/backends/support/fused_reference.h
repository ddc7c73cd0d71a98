// Checking fused all-reduce outputs against the common CPU reference
// (arbiter/common/reference.h), computed and compared in token chunks on
// every core: FP8 and NVFP4 outputs are dequantised and must be codes some
// value within the reference's bound quantises to.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "arbiter/common/nvfp4.h"
#include "arbiter/common/reference.h"
#include "arbiter_backend.h"
#include "fused_call.h"
#include "fused_inputs.h"
#include "gpu_check.h"
#include "parallel_for.h"

namespace arbiter::test {

// A call that ran, with the bits every rank and algorithm agreed on.
struct Result {
  Call call;
  HostOutputs out;
  Bytes scales;  // NVFP4: scale_out in linear layout
};

// Checks tokens [t0, t0 + ref tokens) of `r` against the reference.
inline void check_chunk(const Result& r, const common::ReferenceCase& rc,
                        const common::ReferenceOutputs& ref, std::uint32_t t0) {
  const Call& c = r.call;
  std::ostringstream context_text;
  context_text << c.name();
  if (t0 != 0 || rc.tokens != c.tokens) {
    context_text << " (tokens " << t0 << "-" << t0 + rc.tokens - 1
                 << "; token numbers below count from " << t0 << ")";
  }
  const std::string context = context_text.str();
  const std::size_t first = std::size_t{t0} * c.hidden;
  const std::size_t offset = first * c.element_size();
  if (c.writes_allreduce_out()) {
    const std::string e = common::check_output(r.out.allreduce_out.data() + offset, c.dtype,
                                               ref.sum, ref.sum_bound, c.hidden, "allreduce_out");
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (!c.norm()) return;
  if (c.writes_residual_out()) {
    const std::string e =
        common::check_output(r.out.residual_out.data() + offset, c.dtype, ref.residual,
                             ref.residual_bound, c.hidden, "residual_out");
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (c.writes_norm_out()) {
    const std::string e = common::check_output(r.out.norm_out.data() + offset, c.dtype, ref.norm,
                                               ref.norm_bound, c.hidden, "norm_out");
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (c.fp8()) {
    const std::string e =
        common::check_fp8(r.out.quant_out.data() + first, ref, kFp8Scale, c.hidden);
    ARBITER_CHECK(e.empty(), context, e);
  }
  if (c.fp4()) {
    common::ReferenceCase nvfp4 = rc;
    nvfp4.scale = kNvfp4GlobalScale;
    nvfp4.linear_scales = true;  // r.scales is linear
    const std::string e = common::check_nvfp4(
        r.out.quant_out.data() + first / 2,
        r.scales.data() + common::linear_scale_offset(t0, 0, c.scale_blocks()), nvfp4, ref);
    ARBITER_CHECK(e.empty(), context, e);
  }
}

// Checks every result (all of one shape, dtype, weight_bias and inputs)
// against one reference, computed and compared in token chunks in parallel.
inline void check_results(const std::vector<Result>& results, const HostView& view) {
  if (results.empty()) return;
  const Call& c0 = results.front().call;
  bool any_norm = false;
  for (const Result& r : results) any_norm = any_norm || r.call.norm();
  const std::uint32_t chunk = std::max<std::uint32_t>(1, (c0.tokens + 63) / 64);
  const std::size_t chunks = (c0.tokens + chunk - 1) / chunk;
  parallel_for(chunks, [&](std::size_t k) {
    const std::uint32_t t0 = static_cast<std::uint32_t>(k) * chunk;
    const std::uint32_t t1 = std::min(c0.tokens, t0 + chunk);
    const std::size_t offset = std::size_t{t0} * c0.hidden * c0.element_size();
    common::ReferenceCase rc;
    rc.pattern = any_norm ? ARBITER_PATTERN_RESIDUAL_RMSNORM : ARBITER_PATTERN_ALLREDUCE;
    rc.dtype = c0.dtype;
    rc.tokens = t1 - t0;
    rc.hidden = c0.hidden;
    for (int r = 0; r < c0.world_size; ++r) rc.inputs.push_back(view.inputs[r] + offset);
    rc.residual_in = view.residual + offset;
    rc.gamma = view.gamma;
    rc.eps = kEps;
    rc.weight_bias = c0.weight_bias;
    const common::ReferenceOutputs ref = common::compute_reference(rc);
    // Residual-free calls (residual_in NULL) against the sum alone.
    common::ReferenceCase free_rc = rc;
    free_rc.residual_in = nullptr;
    std::optional<common::ReferenceOutputs> free_ref;
    for (const Result& r : results) {
      if (r.call.norm() && !r.call.residual_in) {
        if (!free_ref) free_ref = common::compute_reference(free_rc);
        check_chunk(r, free_rc, *free_ref, t0);
      } else {
        check_chunk(r, rc, ref, t0);
      }
    }
  });
}

}  // namespace arbiter::test
