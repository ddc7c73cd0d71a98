// Which version of the per-token kernels a workspace runs (token_kernels.h).
#include "token_kernels.h"

#include <cstring>
#include <iterator>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace arbiter::shm {

namespace {

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool cpu_has_avx512bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14 has no name for it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && f16c;
#else
  return false;
#endif
}

// Every level, widest first; scalar runs anywhere.
constexpr const char* kLevels[] = {"avx512bf16", "avx512", "avx2", "scalar"};

// The kernels named `name` if this build has them and this CPU runs them.
const TokenKernels* runnable(const std::string& name) {
  if (name == "avx512bf16") return cpu_has_avx512bf16() ? avx512bf16_kernels() : nullptr;
  if (name == "avx512") return cpu_has_avx512() ? avx512_kernels() : nullptr;
  if (name == "avx2") return cpu_has_avx2() ? avx2_kernels() : nullptr;
  return &kScalarKernels;
}

}  // namespace

Status choose_token_kernels(const char* request, const TokenKernels** out) {
  const std::string name = request == nullptr ? "" : request;
  if (name.empty() || name == "auto") {
    for (const char* level : kLevels) {
      if (const TokenKernels* kernels = runnable(level); kernels != nullptr) {
        *out = kernels;
        return {};
      }
    }
  }
  std::string levels, have;
  bool known = false;
  for (const char* level : kLevels) {
    known = known || name == level;
    levels += std::string(level == kLevels[std::size(kLevels) - 1] ? " or " : ", ") + level;
    if (runnable(level) != nullptr) have += std::string(have.empty() ? "" : ", ") + level;
  }
  if (!known) {
    return {ARBITER_INVALID_ARGUMENT,
            "ARBITER_SHM_ISA='" + name + "' is not a level; use auto" + levels};
  }
  const TokenKernels* kernels = runnable(name);
  if (kernels == nullptr) {
    return {ARBITER_UNSUPPORTED, "ARBITER_SHM_ISA=" + name +
                                     ": this CPU or build cannot run it (it can run " + have +
                                     "); use auto"};
  }
  *out = kernels;
  return {};
}

}  // namespace arbiter::shm
