// Host-side rules of the nccl backend, CUDA- and NCCL-free so that the CPU
// tests check them: what probe() offers on a device (patterns_for), the
// world sizes and dtypes it takes, the size of a workspace's scratch
// (scratch_bytes_for) and the admission of one run() call (check_call). A
// call refused here changes nothing.
//
// Messages name the numbers and carry no backend prefix (the module adds
// "nccl: "). Host only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "arbiter/common/arch_coverage.h"
#include "arbiter/common/call_checks.h"
#include "arbiter/common/names.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::nccl {

using common::Status;

inline constexpr std::uint32_t kSupportedPatterns =
    (1u << ARBITER_PATTERN_ALLREDUCE) | (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM) |
    (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) | (1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4);
// The patterns run by our epilogue kernel after ncclAllReduce.
inline constexpr std::uint32_t kNormPatterns =
    kSupportedPatterns & ~(1u << ARBITER_PATTERN_ALLREDUCE);
inline constexpr std::uint32_t kSupportedDtypes =
    (1u << ARBITER_DTYPE_FP16) | (1u << ARBITER_DTYPE_BF16) | (1u << ARBITER_DTYPE_FP32);
// Every world size from 1 (bit w = world size w; the host reads no bit for
// 64 and up, which NCCL runs too). NCCL runs one-rank communicators, and a
// TP=1 job's fallback is one.
inline constexpr std::uint64_t kWorldSizeMask = ~std::uint64_t{1};
// Scratch: at least this much (fewer, larger NCCL calls when chunking), at
// most that much (chunks this large are bandwidth-bound anyway).
inline constexpr std::uint64_t kMinScratchBytes = std::uint64_t{16} << 20;
inline constexpr std::uint64_t kMaxScratchBytes = std::uint64_t{256} << 20;

inline bool known_dtype(std::int64_t d) {
  return d >= 0 && d < 32 && ((kSupportedDtypes >> d) & 1u);
}

inline bool known_pattern(std::int64_t p) {
  return p >= 0 && p < 32 && ((kSupportedPatterns >> p) & 1u);
}

inline std::size_t element_bytes(arbiter_dtype d) { return d == ARBITER_DTYPE_FP32 ? 4 : 2; }

// The patterns a device of `capability` runs with a build for `archs`: plain
// all-reduce needs only NCCL, the norm patterns our kernel, NVFP4 also
// capability >= 100 and a kernel compiled for it.
inline std::uint32_t patterns_for(std::uint32_t capability, const char* archs) {
  if (!common::kernel_built_for(capability, archs)) return 1u << ARBITER_PATTERN_ALLREDUCE;
  std::uint32_t patterns = kSupportedPatterns & ~(1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4);
  if (common::nvfp4_kernel_built_for(capability, archs)) {
    patterns |= 1u << ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  }
  return patterns;
}

// The size of the scratch a workspace with this spec holds (0: none). A pure
// function of fields every rank agrees on, so chunk plans match across ranks.
inline std::uint64_t scratch_bytes_for(const arbiter_workspace_spec& spec) {
  const std::uint32_t mask = spec.pattern_mask == 0 ? kSupportedPatterns : spec.pattern_mask;
  if ((mask & kNormPatterns) == 0) return 0;
  const std::uint64_t elt =
      known_dtype(common::raw_enum(spec.dtype)) ? element_bytes(spec.dtype) : 4;
  std::uint64_t declared = 0;
  if (__builtin_mul_overflow(std::uint64_t{spec.max_tokens} * spec.hidden, elt, &declared)) {
    declared = kMaxScratchBytes;
  }
  std::uint64_t want = std::max<std::uint64_t>(spec.max_message_bytes, declared);
  want = std::clamp(want, kMinScratchBytes, kMaxScratchBytes);
  return (want + 255) & ~std::uint64_t{255};
}

// What a call is checked against: the workspace's patterns and the devices
// of its ranks.
struct CallRules {
  std::uint32_t pattern_mask = 0;     // the workspace's (never 0: 0 means all)
  std::uint32_t device_patterns = 0;  // runnable on every rank's device
  std::uint32_t capability = 0;       // this rank's device
  std::uint32_t min_capability = 0;   // the lowest over the ranks
  const char* kernel_archs = "";      // what this build's kernel was compiled for
};

// Admits one run() call: its kind (pattern, algorithm, dtype) against the
// workspace and the devices, then its buffers and scalars. NVFP4 calls get
// the fused modules' checks (common/call_checks.h): fp16/bf16, hidden % 16,
// 16-byte aligned vectors, quant_out 4-byte aligned, scale_out required.
// The other norm patterns take any element-aligned buffers (the kernel then
// works element by element). residual_out is optional: the kernel stores x
// there, or in the workspace's scratch when it is NULL, and reads it back
// for the norm.
inline Status check_call(const CallRules& w, const arbiter_allreduce_args& a) {
  const auto n = [](auto v) { return std::to_string(v); };
  const std::int64_t p = common::raw_enum(a.pattern);
  if (!known_pattern(p)) {
    return Status(ARBITER_UNSUPPORTED,
                  "pattern " + n(p) +
                      " is not supported (allreduce, residual_rmsnorm, residual_rmsnorm_fp8 or "
                      "residual_rmsnorm_fp4)");
  }
  if (((w.pattern_mask >> p) & 1u) == 0) {
    return Status(ARBITER_UNSUPPORTED, std::string("pattern ") + common::pattern_text(p) +
                                           " is not in the workspace's pattern_mask (" +
                                           n(w.pattern_mask) + ")");
  }
  const bool fp4 = p == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4;
  if (((w.device_patterns >> p) & 1u) == 0) {
    const std::uint32_t need = common::kMinNvfp4Capability;
    if (fp4 && w.capability < need) {
      return Status(ARBITER_UNSUPPORTED, "NVFP4 needs capability >= " + n(need) +
                                             " (this device is " + n(w.capability) + ")");
    }
    if (fp4 && w.min_capability < need) {
      return Status(ARBITER_UNSUPPORTED, "NVFP4 needs capability >= " + n(need) +
                                             " on every rank (a peer's device is " +
                                             n(w.min_capability) + ")");
    }
    return Status(ARBITER_UNSUPPORTED, std::string("pattern ") + common::pattern_text(p) +
                                           ": this build has no epilogue kernel for the device "
                                           "of this rank or a peer (built for " +
                                           w.kernel_archs + ")");
  }
  const std::int64_t algorithm = common::raw_enum(a.algorithm);
  if (algorithm != ARBITER_ALGORITHM_NATIVE) {
    return Status(ARBITER_UNSUPPORTED,
                  "algorithm " + n(algorithm) + " is not supported (only native)");
  }
  const std::int64_t dtype = common::raw_enum(a.dtype);
  if (!known_dtype(dtype)) {
    return Status(ARBITER_UNSUPPORTED, "dtype " + n(dtype) + " is not supported");
  }
  if (a.hidden == 0) return Status(ARBITER_INVALID_ARGUMENT, "hidden is 0");
  if (Status s = common::check_nvfp4(a, w.min_capability); !s.ok()) return s;

  const auto null = [](const char* name, const char* why = "") {
    return Status(ARBITER_INVALID_ARGUMENT, std::string(name) + " is NULL" + why);
  };
  if (a.input == nullptr) return null("input");
  if (p == ARBITER_PATTERN_ALLREDUCE) {
    if (a.allreduce_out == nullptr) return null("allreduce_out", " (pattern allreduce)");
    return common::check_aliasing(a);
  }
  // residual_out may be NULL (the ABI's optional outputs): the epilogue
  // then keeps x in the workspace's scratch.
  if (fp4) return common::check_call_buffers(a);

  if (a.gamma == nullptr) return null("gamma");
  if (p == ARBITER_PATTERN_RESIDUAL_RMSNORM && a.norm_out == nullptr) {
    return null("norm_out", " (residual_rmsnorm writes its norm there)");
  }
  if (p == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) {
    if (a.quant_out == nullptr) return null("quant_out");
    if (a.scale == nullptr) return null("scale");
  }
  const std::uintptr_t elt = element_bytes(a.dtype);
  const struct {
    const char* name;
    const void* pointer;
  } buffers[] = {{"input", a.input},
                 {"allreduce_out", a.allreduce_out},
                 {"residual_in", a.residual_in},
                 {"residual_out", a.residual_out},
                 {"gamma", a.gamma},
                 {"norm_out", a.norm_out}};
  for (const auto& b : buffers) {
    if (reinterpret_cast<std::uintptr_t>(b.pointer) % elt != 0) {
      return Status(
          ARBITER_INVALID_ARGUMENT,
          std::string(b.name) + " is not aligned to its element size (" + n(elt) + " bytes)");
    }
  }
  if (Status s = common::check_aliasing(a); !s.ok()) return s;
  return common::check_call_values(a);
}

}  // namespace arbiter::nccl
