// Host-side admission of one run() call, the part every GPU backend shares:
// the call's kind (pattern, algorithm, dtype), NVFP4's requirements, the
// caller's buffers (required pointers per pattern, alignment, aliasing) and
// the scalars the epilogue reads (eps, weight_bias). A
// backend's guards add what depends on its workspace: world size, the
// workspace's dtype, per-call capacity. A refused call changes nothing.
//
// Messages name the numbers and carry no backend prefix (the backend adds
// it). Host only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "arbiter/common/aliasing.h"
#include "arbiter/common/launch_config.h"
#include "arbiter/common/numeric.h"
#include "arbiter/common/status.h"
#include "arbiter_backend.h"

namespace arbiter::common {

// NVFP4 needs SM100+: FlashInfer's quantiser compiled to a silent no-op on
// SM90, so the guards refuse it below this capability instead.
inline constexpr std::uint32_t kMinNvfp4Capability = 100;

inline const char* algorithm_name(arbiter_algorithm algorithm) {
  switch (algorithm) {
    case ARBITER_ALGORITHM_ONESHOT:
      return "one-shot";
    case ARBITER_ALGORITHM_TWOSHOT:
      return "two-shot";
    case ARBITER_ALGORITHM_NATIVE:
      return "native";
  }
  return "unknown";
}

// Bytes quant_out must be aligned to: a thread stores the quantised form of
// one 16-byte input vector at once. FP8: one byte per element (8 for
// fp16/bf16, 4 for fp32); NVFP4: half a byte per element (4). 1 otherwise.
constexpr std::uint32_t quant_out_alignment(arbiter_pattern pattern, arbiter_dtype dtype) {
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8) return vector_elements(dtype);
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) return vector_elements(dtype) / 2;
  return 1;
}

// The value a C caller stored in an ABI enum field. C allows any int there;
// reading the field as the C++ enum type is undefined for a value outside
// the enumerators' range (UBSan's enum check, found by test-hardening.sh),
// so the bytes are copied out as the underlying integer instead.
template <class Enum>
inline std::int64_t raw_enum(const Enum& field) {
  std::underlying_type_t<Enum> value;
  std::memcpy(&value, &field, sizeof value);
  return static_cast<std::int64_t>(value);
}

// A known pattern, one-shot or two-shot, and a known dtype.
inline Status check_call_kind(const arbiter_allreduce_args& a) {
  const auto n = [](std::int64_t v) { return std::to_string(v); };
  const std::int64_t pattern = raw_enum(a.pattern);
  if (pattern < ARBITER_PATTERN_ALLREDUCE || pattern > ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    return Status(ARBITER_UNSUPPORTED, "pattern " + n(pattern) + " is not supported");
  }
  const std::int64_t algorithm = raw_enum(a.algorithm);
  if (algorithm != ARBITER_ALGORITHM_ONESHOT && algorithm != ARBITER_ALGORITHM_TWOSHOT) {
    return Status(ARBITER_UNSUPPORTED,
                  "algorithm " + n(algorithm) + " is not supported (one-shot or two-shot)");
  }
  const std::int64_t dtype = raw_enum(a.dtype);
  if (!is_valid_dtype(dtype)) {
    return Status(ARBITER_UNSUPPORTED, "dtype " + n(dtype) + " is not fp16, bf16 or fp32");
  }
  return Status();
}

// For the NVFP4 pattern: capability >= 100, fp16/bf16 input, hidden a
// multiple of the 16-element scale block. OK for every other pattern.
// REQUIRES: check_call_kind(a) passed.
inline Status check_nvfp4(const arbiter_allreduce_args& a, std::uint32_t capability) {
  if (a.pattern != ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) return Status();
  const auto n = [](std::uint32_t v) { return std::to_string(v); };
  if (capability < kMinNvfp4Capability) {
    return Status(ARBITER_UNSUPPORTED, "NVFP4 needs capability >= " + n(kMinNvfp4Capability) +
                                           " (this device is " + n(capability) + ")");
  }
  if (a.dtype == ARBITER_DTYPE_FP32) {
    return Status(ARBITER_UNSUPPORTED, "NVFP4 needs fp16 or bf16 input, not fp32");
  }
  if (a.hidden % kNvfp4BlockElements != 0) {
    return Status(ARBITER_UNSUPPORTED,
                  "NVFP4 needs hidden % 16 == 0 (hidden is " + n(a.hidden) + ")");
  }
  return Status();
}

// The scalars of the norm patterns: eps finite and >= 0 (a NaN or negative
// eps turns every norm into NaN or infinity), weight_bias finite, and
// `scale` aligned to a float (the kernels load it as one; a misaligned load
// is a device fault that kills the context). OK for pattern allreduce.
inline Status check_call_values(const arbiter_allreduce_args& a) {
  if (a.pattern == ARBITER_PATTERN_ALLREDUCE) return Status();
  if (!(std::isfinite(a.eps) && a.eps >= 0.0f)) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "eps is " + std::to_string(a.eps) + "; it must be finite and >= 0");
  }
  if (!std::isfinite(a.weight_bias)) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "weight_bias is " + std::to_string(a.weight_bias) + "; it must be finite");
  }
  if (reinterpret_cast<std::uintptr_t>(a.scale) % alignof(float) != 0) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "scale is not aligned to a float (" + std::to_string(alignof(float)) + " bytes)");
  }
  return Status();
}

// The pointers the ABI requires for the pattern (arbiter_backend.h), the
// 16-byte alignment of every buffer moved in 16-byte vectors,
// quant_out_alignment(), the aliasing contract (aliasing.h) and
// check_call_values(). Rows are 16-byte multiples (check_hidden), so an
// aligned base keeps every vector aligned. REQUIRES: check_call_kind(a) passed.
inline Status check_call_buffers(const arbiter_allreduce_args& a) {
  const auto null = [](const char* name, const char* why) {
    return Status(ARBITER_INVALID_ARGUMENT, std::string(name) + " is NULL" + why);
  };
  const arbiter_pattern pattern = a.pattern;
  if (a.input == nullptr) return null("input", "");
  if (pattern == ARBITER_PATTERN_ALLREDUCE) {
    if (a.allreduce_out == nullptr) return null("allreduce_out", " (pattern allreduce)");
  } else {
    if (a.gamma == nullptr) return null("gamma", " (norm patterns)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM && a.norm_out == nullptr) {
    return null("norm_out", " (residual_rmsnorm writes its norm there)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP8 ||
      pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4) {
    if (a.quant_out == nullptr) return null("quant_out", " (quantising patterns)");
    if (a.scale == nullptr) return null("scale", " (quantising patterns)");
  }
  if (pattern == ARBITER_PATTERN_RESIDUAL_RMSNORM_FP4 && a.scale_out == nullptr) {
    return null("scale_out", " (NVFP4 writes its block scales there)");
  }
  const struct {
    const char* name;
    const void* pointer;
  } vectors[] = {{"input", a.input},
                 {"allreduce_out", a.allreduce_out},
                 {"residual_in", a.residual_in},
                 {"residual_out", a.residual_out},
                 {"gamma", a.gamma},
                 {"norm_out", a.norm_out}};
  for (const auto& v : vectors) {
    if (reinterpret_cast<std::uintptr_t>(v.pointer) % kVectorBytes != 0) {
      return Status(ARBITER_INVALID_ARGUMENT, std::string(v.name) + " is not " +
                                                  std::to_string(kVectorBytes) + "-byte aligned");
    }
  }
  const std::uint32_t quant = quant_out_alignment(pattern, a.dtype);
  if (reinterpret_cast<std::uintptr_t>(a.quant_out) % quant != 0) {
    return Status(ARBITER_INVALID_ARGUMENT,
                  "quant_out is not " + std::to_string(quant) + "-byte aligned");
  }
  if (Status s = check_aliasing(a); !s.ok()) return s;
  return check_call_values(a);
}

}  // namespace arbiter::common
